"""Which source (relay or upstream) to fetch the next shard from: a small state machine, no I/O.

Each source has a measured throughput (an exponential moving average of bytes/s over finished
shards), a count of consecutive failures and a number of fetches in flight. A pick is a
weighted random draw among usable sources, with weight

    throughput / (1 + in_flight) / (1 + consecutive_failures)^2

so fast sources get most of the work, busy ones share it, and flaky ones are tried less.
A source never measured counts as fast as the best measured one, so every source gets tried.

Outcomes of a fetch, as recorded by :meth:`Scoreboard.record`:

- ``ok``: throughput updated, failures reset.
- ``network`` (refused, reset, timeout, 5xx): one more consecutive failure and a cool-down
  growing exponentially with them (``backoff_base_s * 2**(n-1)``, capped), during which the
  source is not picked.
- ``slow`` (cut off by the progress deadline, or outrun by a hedged request to another
  source): a failure as ``network``, and the rate it managed enters its throughput, so a
  trickling source is demoted below every healthy one.
- ``not_ready`` (a relay still mirroring the shard): no penalty; the caller retries later.
- ``cancelled`` (a hedge that lost to the request it hedged): no penalty.
- ``integrity`` (bytes or manifest that do not match what the coordinator signed): the
  source is banned for ``ban_s`` (forever by default): it is broken or malicious.
- ``short`` (a body that broke off before its declared length): a failure as ``network``;
  the ``SHORT_BODIES_TO_BAN``-th one from a source bans it like ``integrity`` (a relay that
  truncates shards never wastes more than one retry).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["ok", "network", "slow", "not_ready", "integrity", "cancelled", "short"]
SHORT_BODIES_TO_BAN = 2
"""Bodies cut short before a source is banned: one can be a dropped connection, two are a pattern."""
_EWMA_ALPHA = 0.3
_DEFAULT_THROUGHPUT_BPS = 100e6


@dataclass
class SourceState:
    url: str
    throughput_bps: float | None = None
    num_ok: int = 0
    num_failures: int = 0
    consecutive_failures: int = 0
    num_short: int = 0
    in_flight: int = 0
    cooldown_until: float = 0.0
    banned_until: float = 0.0
    last_error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "throughput_bps": round(self.throughput_bps or 0.0),
            "num_ok": self.num_ok,
            "num_failures": self.num_failures,
            "banned": self.banned_until > 0,
            "last_error": self.last_error,
        }


class Scoreboard:
    """Scores for a fixed set of sources; not thread-safe (one event loop drives it)."""

    def __init__(
        self,
        urls: Iterable[str],
        backoff_base_s: float = 0.25,
        backoff_max_s: float = 10.0,
        ban_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.sources = {url: SourceState(url) for url in urls}
        if not self.sources:
            raise ValueError("a scoreboard needs at least one source")
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.ban_s = ban_s
        self.clock = clock
        self.rng = rng or random.Random()

    def is_banned(self, url: str) -> bool:
        return self.sources[url].banned_until > self.clock()

    def usable(self, exclude: Iterable[str] = ()) -> list[str]:
        """Sources neither banned nor excluded (cooling down or not)."""
        skipped = set(exclude)
        return [url for url in self.sources if url not in skipped and not self.is_banned(url)]

    def weight(self, url: str) -> float:
        state = self.sources[url]
        measured = [s.throughput_bps for s in self.sources.values() if s.throughput_bps is not None]
        optimistic = max(measured) if measured else _DEFAULT_THROUGHPUT_BPS
        throughput = state.throughput_bps if state.throughput_bps is not None else optimistic
        return max(throughput, 1.0) / (1 + state.in_flight) / (1 + state.consecutive_failures) ** 2

    def choose(self, exclude: Iterable[str] = ()) -> str | None:
        """A source to fetch from now, or None when every usable one is cooling down (or none is left)."""
        now = self.clock()
        ready = [url for url in self.usable(exclude) if self.sources[url].cooldown_until <= now]
        if not ready:
            return None
        weights = [self.weight(url) for url in ready]
        return self.rng.choices(ready, weights=weights, k=1)[0]

    def next_ready_in(self, exclude: Iterable[str] = ()) -> float | None:
        """Seconds until some usable source leaves its cool-down; None when no usable source is left."""
        candidates = self.usable(exclude)
        if not candidates:
            return None
        return max(0.0, min(self.sources[url].cooldown_until for url in candidates) - self.clock())

    def ranked(self) -> list[str]:
        """Usable sources, best first (for one-off requests such as a manifest)."""
        return sorted(self.usable(), key=self.weight, reverse=True)

    def started(self, url: str) -> None:
        self.sources[url].in_flight += 1

    def record(self, url: str, outcome: Outcome, num_bytes: int = 0, seconds: float = 0.0, error: str = "") -> None:
        """Account for one finished fetch (call once per :meth:`started`, or alone for untracked requests)."""
        state = self.sources[url]
        state.in_flight = max(0, state.in_flight - 1)
        now = self.clock()
        if outcome == "ok":
            state.num_ok += 1
            state.consecutive_failures = 0
            state.cooldown_until = 0.0
            if num_bytes > 0 and seconds > 0:
                sample = num_bytes / seconds
                previous = state.throughput_bps
                state.throughput_bps = (
                    sample if previous is None else _EWMA_ALPHA * sample + (1 - _EWMA_ALPHA) * previous
                )
            return
        if outcome in ("not_ready", "cancelled"):
            return
        if outcome == "slow" and seconds > 0:
            sample = num_bytes / seconds
            previous = state.throughput_bps
            state.throughput_bps = sample if previous is None else min(previous, sample)
        state.num_failures += 1
        state.last_error = error
        if outcome == "short":
            state.num_short += 1
        if outcome == "integrity" or state.num_short >= SHORT_BODIES_TO_BAN:
            state.banned_until = now + self.ban_s
            return
        state.consecutive_failures += 1
        delay = self.backoff_base_s * 2 ** (state.consecutive_failures - 1)
        state.cooldown_until = now + min(self.backoff_max_s, delay)

    def snapshot(self) -> list[dict[str, object]]:
        return [state.to_json() for state in self.sources.values()]
