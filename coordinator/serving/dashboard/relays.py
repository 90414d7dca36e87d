"""Relays for the dashboard: which ones announced themselves on gossip, and what each says it holds.

A relay announces its public URL on gossip, signed with its own key (:mod:`shardcast.relay.gossip`); the
gossip filter has already checked the signature and freshness, but anyone can make a key, so
the URL and everything behind it stay untrusted. :class:`RelayWatch` keeps the
``MAX_RELAYS`` most recently heard URLs (http/https, no credentials, query, fragment or
whitespace; one per signer; new ones admitted at a bounded rate), and a background thread asks
each for ``GET {url}/versions`` every ``PROBE_INTERVAL_S`` (rounds at least ``MIN_ROUND_GAP_S``
apart, however many announcements arrive), with a short overall deadline, no redirects, no
proxies, no compression and a cap on the answer's size, validated by the strict
:class:`~protocol.schemas.VersionsResponse`. A dashboard request only reads the cached answers,
so a slow or hostile relay can never block or break it; a relay whose last try failed is shown
as unreachable, with why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from protocol.announcements import Accepted
from protocol.schemas import DashboardRelay, RelayAnnouncement, VersionsResponse

log = logging.getLogger("coordinator.serving.dashboard.relays")

MAX_RELAYS = 16
PROBE_INTERVAL_S = 5.0
MIN_ROUND_GAP_S = 1.0
PROBE_TIMEOUT_S = 2.0
MAX_ANSWER_BYTES = 128 * 1024
FORGET_AFTER_S = 300.0
"""A relay not heard for this long is dropped (relays re-announce every 30 s)."""
NEW_RELAY_INTERVAL_S = 5.0
"""New URLs are admitted at this average rate (after a burst of MAX_RELAYS), so keys made up by the
dozen cannot turn the coordinator into a fast scanner of other hosts."""
MAX_VERSIONS_SHOWN = 32


class RelayAnswerError(Exception):
    """A relay's ``/versions`` could not be had or was not acceptable; the message says why, in a few words."""


def relay_url(url: str) -> str | None:
    """``url`` without a trailing slash when it is a plain http(s) base URL with a host; None otherwise."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return None
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host or parsed.userinfo:
        return None
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        return None
    return url.rstrip("/")


def fetch_versions(
    client: httpx.Client, url: str, timeout_s: float = PROBE_TIMEOUT_S, max_bytes: int = MAX_ANSWER_BYTES
) -> VersionsResponse:
    """What the relay at ``url`` says it holds; RelayAnswerError when that cannot be had within the limits."""
    deadline = time.monotonic() + timeout_s
    try:
        with client.stream("GET", f"{url}/versions", headers={"accept-encoding": "identity"}) as response:
            if response.is_redirect:
                raise RelayAnswerError(f"redirect ({response.status_code}) refused")
            if response.status_code != 200:
                raise RelayAnswerError(f"HTTP {response.status_code}")
            if response.headers.get("content-encoding", "identity") != "identity":
                raise RelayAnswerError("compressed answer refused")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise RelayAnswerError(f"answer over {max_bytes} bytes")
            body = bytearray()
            for chunk in response.iter_raw():
                body += chunk
                if len(body) > max_bytes:
                    raise RelayAnswerError(f"answer over {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise RelayAnswerError("timed out")
    except httpx.TimeoutException as exc:
        raise RelayAnswerError("timed out") from exc
    except httpx.HTTPError as exc:
        raise RelayAnswerError(f"connection failed ({type(exc).__name__})") from exc
    try:
        listing = VersionsResponse.model_validate_json(bytes(body), strict=True)
    except ValidationError as exc:
        raise RelayAnswerError("malformed answer") from exc
    if listing.role != "relay":
        raise RelayAnswerError(f"answers as {listing.role}, not relay")
    return listing


@dataclass
class RelayRecord:
    """One relay heard on gossip and the outcome of the last try to read its ``/versions``."""

    url: str
    signer: str
    heard_at: float
    checked_at: float | None = None
    answered_at: float | None = None
    error: str | None = None
    listing: VersionsResponse | None = None

    def view(self) -> DashboardRelay:
        infos = self.listing.versions if self.listing is not None else []
        held = sorted({i.version for i in infos if i.num_shards_ready >= i.num_shards})[-MAX_VERSIONS_SHOWN:]
        mirroring = sorted({i.version for i in infos if i.num_shards_ready < i.num_shards})[-MAX_VERSIONS_SHOWN:]
        return DashboardRelay(
            url=self.url,
            heard_at=self.heard_at,
            checked_at=self.checked_at,
            answered_at=self.answered_at,
            reachable=self.checked_at is not None and self.error is None,
            error=self.error,
            versions_held=held,
            versions_mirroring=mirroring,
        )


class RelayWatch:
    """The relays heard on gossip and their cached ``/versions``; thread-safe, probing in its own thread."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = PROBE_TIMEOUT_S,
        max_relays: int = MAX_RELAYS,
    ) -> None:
        self.clock = clock
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_relays = max_relays
        self._relays: dict[str, RelayRecord] = {}
        self._admissions = float(MAX_RELAYS)
        self._admitted_at: float | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_announcement(self, accepted: Accepted) -> None:
        """Gossip listener (kind ``relay``): remember the URL the relay announced."""
        if isinstance(accepted.body, RelayAnnouncement):
            self.heard(accepted.body.url, accepted.signer)

    def heard(self, url: str, signer: str) -> bool:
        """Remember that ``signer`` announced a relay at ``url`` now; False when the URL is refused or new ones
        come too fast."""
        clean = relay_url(url)
        if clean is None:
            log.debug("ignoring relay URL %r announced by %s", url[:100], signer)
            return False
        now = self.clock()
        with self._lock:
            if clean not in self._relays and not self._admit(now):
                log.debug("too many new relay URLs; ignoring %r for now", clean[:100])
                return False
            for other in [r.url for r in self._relays.values() if r.signer == signer and r.url != clean]:
                del self._relays[other]  # a relay that moved: only its newest URL is asked
            record = self._relays.get(clean)
            is_new = record is None
            if record is None:
                self._relays[clean] = RelayRecord(clean, signer, now)
            else:
                record.heard_at, record.signer = now, signer
            self._forget(now)
        if is_new:
            self._wake.set()
        return True

    def _admit(self, now: float) -> bool:
        """Take one admission of a new URL from the bucket (refilled one per NEW_RELAY_INTERVAL_S)."""
        if self._admitted_at is not None:
            refill = (now - self._admitted_at) / NEW_RELAY_INTERVAL_S
            self._admissions = min(float(MAX_RELAYS), self._admissions + max(0.0, refill))
        self._admitted_at = now
        if self._admissions < 1.0:
            return False
        self._admissions -= 1.0
        return True

    def _forget(self, now: float) -> None:
        for url in [r.url for r in self._relays.values() if now - r.heard_at > FORGET_AFTER_S]:
            del self._relays[url]
        while len(self._relays) > self.max_relays:
            oldest = min(self._relays.values(), key=lambda r: r.heard_at)
            del self._relays[oldest.url]

    def relays(self) -> list[DashboardRelay]:
        """What is known of each relay, most recently heard first."""
        with self._lock:
            self._forget(self.clock())
            records = sorted(self._relays.values(), key=lambda r: r.heard_at, reverse=True)
            return [record.view() for record in records]

    def probe_all(self, client: httpx.Client, pool: ThreadPoolExecutor) -> None:
        """Ask every known relay for its versions, concurrently; each outcome is cached as soon as it comes."""
        with self._lock:
            urls = list(self._relays)
        for future in [pool.submit(self._probe, client, url) for url in urls]:
            future.result()

    def _probe(self, client: httpx.Client, url: str) -> None:
        outcome: VersionsResponse | str
        try:
            outcome = fetch_versions(client, url, self.timeout_s)
        except RelayAnswerError as exc:
            outcome = str(exc)
        except Exception as exc:  # a hostile answer must never end the probing thread
            log.warning("relay %s: unexpected probe failure %r", url, exc)
            outcome = "probe failed"
        with self._lock:
            record = self._relays.get(url)
            if record is None:
                return  # forgotten meanwhile
            record.checked_at = self.clock()
            if isinstance(outcome, VersionsResponse):
                record.listing, record.answered_at, record.error = outcome, record.checked_at, None
            else:
                record.error = outcome

    def start(self) -> None:
        """Start probing in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dashboard-relays", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * 2 + 5)

    def _run(self) -> None:
        timeout = httpx.Timeout(self.timeout_s)
        with (
            httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client,
            ThreadPoolExecutor(max_workers=self.max_relays, thread_name_prefix="relay-probe") as pool,
        ):
            while not self._stop.is_set():
                self._wake.wait(self.interval_s)
                self._wake.clear()
                if self._stop.is_set():
                    return
                started = time.monotonic()
                self.probe_all(client, pool)
                self._stop.wait(max(0.0, MIN_ROUND_GAP_S - (time.monotonic() - started)))
