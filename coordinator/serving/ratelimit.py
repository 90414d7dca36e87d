"""Token-bucket rate limits keyed by node id, IP address or network prefix, with an injected clock.

Each key gets a bucket of ``burst`` tokens refilled at ``rate_per_s``; a request takes one
token or is told how long to wait. The table is bounded: when full, the least recently used
keys are dropped (a dropped key starts again with a full bucket, which only errs towards
letting a request through). Behind a load balancer over N API processes on one ledger each process
enforces ``share`` = 1/N of the rate and burst (:mod:`coordinator.ledger.api_processes`), so a source's
requests summed over the processes stay within the setting.
:class:`RegistrationLimit` caps new identities per source address and per network prefix.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from coordinator.ledger.sources import SourcePolicy


class RateLimiter:
    def __init__(
        self, rate_per_s: float, burst: int, max_keys: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.share = 1.0
        """The part of the limit this process enforces: 1/N when N API processes serve the ledger."""

    def retry_after_s(self, key: str) -> float | None:
        """Take one token for ``key``: None when allowed, else the seconds until one is available."""
        now = self._clock()
        rate, burst = self.rate_per_s * self.share, max(1.0, self.burst * self.share)
        with self._lock:
            tokens, last = self._buckets.pop(key, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            allowed = tokens >= 1.0
            if allowed:
                tokens -= 1.0
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        return None if allowed else (1.0 - tokens) / rate


class RegistrationLimit:
    """Registrations capped per source address and per network prefix, each with its own token bucket.

    Both buckets must have a token; allow-listed addresses are not limited (see
    :class:`coordinator.ledger.sources.SourcePolicy`). A registration refused by the prefix bucket has
    still spent its address's token, which only errs towards refusing a flood.
    """

    def __init__(self, sources: SourcePolicy, address: RateLimiter, prefix: RateLimiter) -> None:
        self.sources = sources
        self.address = address
        self.prefix = prefix

    def retry_after_s(self, address: str) -> float | None:
        """Take a registration for ``address``: None when allowed, else the seconds until one is available."""
        if self.sources.is_allowed(address):
            return None
        address_wait_s = self.address.retry_after_s(address)
        if address_wait_s is not None:
            return address_wait_s
        return self.prefix.retry_after_s(self.sources.prefix(address))
