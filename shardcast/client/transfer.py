"""Fetching the shards of one version from several untrusted sources at once, verifying each.

The one engine behind both the relay (mirroring from upstreams) and the client (downloading
from relays). ``num_parallel`` tasks take shards from a queue; each picks a source from the
:class:`~shardcast.client.scoring.Scoreboard`, streams ``GET {source}/v/{N}/shards/{i}`` (through a
:class:`~shardcast.client.fetchers.ShardFetcher`) into a
:class:`ShardSink`, hashing as the bytes arrive, and commits the shard only when its hash is
the one the coordinator signed. A failed shard goes back on the queue with exponential
backoff and another source is tried (the failing one is excluded for that shard); after
``max_attempts_per_shard`` failures the whole transfer fails. A relay answering 503 (it is
still mirroring that shard) costs no attempt: the shard is asked for again after a delay that
doubles each time (``not_ready_retry_s`` up to ``backoff_max_s``), and once no shard has verified
for ``not_ready_timeout_s`` while the sources keep answering 503 the transfer gives up
(:class:`~protocol.errors.RemoteUnavailableError`): a relay that never gets the version cannot
keep a node asking forever.
A source that sends bytes that do not match, or a whole response shorter than the signed shard,
is banned by the scoreboard; one whose bodies break off before their declared length is banned
at its second such body (one may be the network's fault, two are the source's).

One slow source costs little. Every fetch runs under a progress deadline
(:mod:`shardcast.client.progress`): a body that starts too late or flows below ``min_rate_bps`` is
cut off and its source demoted (outcome ``slow``). And a fetch still running after
``hedge_after_s`` (or ``hedge_factor`` times what the fastest measured source would need)
is hedged: the same shard is asked of another source, the first verified copy wins, the
other request is cancelled, and a primary that lost to its hedge is demoted the same way.
A fetch is hedged only while it drags behind the fetches from other sources in flight
(:func:`is_dragging`): when every fetch is slow alike, the bottleneck is this machine's own
link, and a second copy would only take bandwidth from the first.

A failure on this machine (no space, permissions, a read-only disk) is not a source's fault:
it stops the transfer at once with :class:`~protocol.errors.LocalFaultError`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field

from protocol.errors import IntegrityError, LocalFaultError, NotFoundError, PrimeError, RemoteUnavailableError
from protocol.schemas import PolicyManifest, ShardEntry
from shardcast.client.fetchers import CutShortError, ShardFetcher
from shardcast.client.progress import ProgressDeadline, TooSlowError, with_progress_deadline
from shardcast.client.scoring import Outcome, Scoreboard
from shardcast.format.manifest import new_hasher
from shardcast.format.store import local_disk

EventSink = Callable[[dict[str, Any]], None]
FailureKind = Literal["network", "slow", "not_ready", "integrity", "missing", "short"]
_HEDGE_RETRY_S = 0.25
"""How soon a dragging fetch asks again for a hedge when none could be started."""
DRAG_RATIO = 2.0
"""A fetch drags when fetches from other sources in flight receive, at the median, this many times its rate."""
_MIN_PEER_AGE_S = 0.2
"""Fetches younger than this say nothing yet about their source's rate."""


def no_events(_event: dict[str, Any]) -> None:
    """The default event sink: drop everything."""


class TransferOptions(BaseModel):
    """How hard the engine tries; shared by relays and clients."""

    model_config = ConfigDict(extra="forbid")

    num_parallel: int = Field(default=8, ge=1, le=256)
    """Shards fetched at the same time (spread over all sources)."""
    max_attempts_per_shard: int = Field(default=6, ge=1, le=100)
    """Failed fetches of one shard (any source) before the transfer gives up."""
    backoff_base_s: float = Field(default=0.2, gt=0)
    """First retry delay of a failed shard; doubles with each failure of that shard."""
    backoff_max_s: float = Field(default=5.0, gt=0)
    """Cap of the retry delay."""
    not_ready_retry_s: float = Field(default=0.3, gt=0)
    """First delay before asking again for a shard a relay has not mirrored yet; doubles up to ``backoff_max_s``."""
    not_ready_timeout_s: float = Field(default=120.0, gt=0)
    """Longest time with no shard verified while the sources answer only 503 (not mirrored yet): then give up."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Time to open a connection to a source."""
    read_timeout_s: float = Field(default=60.0, gt=0)
    """Longest silence while reading a response (relays may hold a shard request while mirroring it)."""
    response_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for the first body byte of a response, trickled or not (above a relay's shard_wait_s)."""
    min_rate_bps: float = Field(default=32 * 1024, ge=0)
    """Slowest body rate accepted from a source, averaged over ``progress_window_s``; 0 disables the floor."""
    progress_window_s: float = Field(default=10.0, gt=0)
    """Window the body rate is measured over."""
    hedge_after_s: float = Field(default=1.5, gt=0)
    """A fetch still running this long (at least) is also asked of another source; the first copy wins."""
    hedge_factor: float = Field(default=4.0, ge=1)
    """Hedge once a fetch takes this many times what the fastest measured source would need (if longer)."""
    max_hedges: int = Field(default=4, ge=0, le=256)
    """Hedged requests in flight at once (0 disables hedging)."""
    fsync_enabled: bool = True
    """Client: sync the files to disk before exposing the version (off trades crash safety for speed)."""


class ShardWriter(Protocol):
    """Where the bytes of one shard go while it is fetched."""

    def write(self, offset: int, data: memoryview) -> None:
        """Store ``data`` at ``offset`` within the shard (copy it: the buffer is reused)."""
        ...

    def commit(self) -> None:
        """The shard verified: make it final."""
        ...

    def discard(self) -> None:
        """The fetch failed: forget what was written."""
        ...


class ShardSink(Protocol):
    """Hands out a writer per fetch; a hedged shard gets a second writer while the first is open."""

    location: Path
    """The local directory written to (named in local-fault errors)."""

    def open_shard(self, shard: ShardEntry) -> ShardWriter: ...


class ShardFetchError(Exception):
    """One fetch of one shard from one source failed (kept inside the engine)."""

    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def http_timeout(options: TransferOptions) -> httpx.Timeout:
    return httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s)


def progress_deadline(options: TransferOptions) -> ProgressDeadline:
    return ProgressDeadline(options.response_timeout_s, options.min_rate_bps, options.progress_window_s)


def shard_url(source: str, version: int, index: int) -> str:
    return f"{source.rstrip('/')}/v/{version}/shards/{index}"


@dataclass(eq=False)
class _Attempt:
    """One fetch of one shard from one source (the primary, or a hedge of it)."""

    source: str
    hedge: bool
    started: float = field(default_factory=time.monotonic)
    received: int = 0
    task: asyncio.Task[None] | None = None


def is_dragging(attempt: _Attempt, in_flight: Sequence[_Attempt], now: float) -> bool:
    """Whether ``attempt`` is slow next to the fetches from other sources in flight (each rate: bytes received
    over its age). With no such fetch to compare with, any fetch past its hedge delay counts as dragging."""
    peers = [a for a in in_flight if a.source != attempt.source and now - a.started >= _MIN_PEER_AGE_S]
    if not peers:
        return True
    rates = sorted(a.received / (now - a.started) for a in peers)
    median = rates[len(rates) // 2] if len(rates) % 2 else (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2
    own = attempt.received / max(now - attempt.started, 1e-9)
    return own * DRAG_RATIO < median


async def fetch_shard(
    fetcher: ShardFetcher,
    source: str,
    manifest: PolicyManifest,
    shard: ShardEntry,
    sink: ShardSink,
    deadline: ProgressDeadline | None = None,
    attempt: _Attempt | None = None,
) -> None:
    """Stream one shard from ``source`` into ``sink`` and commit it only if its hash matches."""
    where = f"writing shard {shard.index} of version {manifest.version} under {sink.location}"
    with local_disk(where):
        writer = sink.open_shard(shard)
    committed = False
    try:
        await _stream_verified(fetcher, source, manifest, shard, writer, deadline, attempt or _Attempt(source, False))
        with local_disk(where):
            writer.commit()
        committed = True
    finally:
        if not committed:
            with local_disk(where):
                writer.discard()


async def _stream_verified(
    fetcher: ShardFetcher,
    source: str,
    manifest: PolicyManifest,
    shard: ShardEntry,
    writer: ShardWriter,
    deadline: ProgressDeadline | None,
    attempt: _Attempt,
) -> None:
    url = shard_url(source, manifest.version, shard.index)
    hasher = new_hasher(manifest.hash_algorithm)
    local_fault: list[LocalFaultError] = []

    def consume(chunk: memoryview) -> None:
        if attempt.received + len(chunk) > shard.size_bytes:
            raise ShardFetchError("integrity", f"{url}: more than the {shard.size_bytes} bytes signed")
        hasher.update(chunk)
        try:
            writer.write(attempt.received, chunk)
        except OSError as exc:  # kept apart from the network's OSErrors, which the fetcher raises
            local_fault.append(
                LocalFaultError.from_os_error(exc, f"writing shard {shard.index} of v{manifest.version}")
            )
            raise local_fault[-1] from exc
        attempt.received += len(chunk)

    try:
        request = fetcher.get(url, consume)
        if deadline is None:
            status = await request
        else:
            status = await with_progress_deadline(request, lambda: attempt.received, deadline, url)
    except TooSlowError as exc:
        raise ShardFetchError("slow", str(exc)) from exc
    except CutShortError as exc:
        raise ShardFetchError("short", f"{exc}; got {attempt.received} of {shard.size_bytes} bytes") from exc
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        raise ShardFetchError("network", f"{url}: {type(exc).__name__}: {exc}") from exc
    if local_fault:  # a fetcher that swallowed the callback's error must not hide a full disk
        raise local_fault[0]
    if status == 503:
        raise ShardFetchError("not_ready", f"{url}: not mirrored yet")
    if status == 404:
        raise ShardFetchError("missing", f"{url}: 404 (source does not hold this version)")
    if status != 200:
        raise ShardFetchError("network", f"{url}: HTTP {status}")
    if attempt.received != shard.size_bytes:  # a whole response, shorter than signed: the source lies
        raise ShardFetchError("integrity", f"{url}: a {attempt.received}-byte body for a {shard.size_bytes}-byte shard")
    digest = hasher.hexdigest()
    if digest != shard.hash:
        raise ShardFetchError("integrity", f"{url}: {manifest.hash_algorithm} {digest[:16]}... is not the signed hash")


_OUTCOME: dict[FailureKind, Outcome] = {
    "network": "network",
    "slow": "slow",
    "not_ready": "not_ready",
    "integrity": "integrity",
    "missing": "network",
    "short": "short",
}


async def fetch_shards(
    fetcher: ShardFetcher,
    manifest: PolicyManifest,
    pending: Sequence[ShardEntry],
    scoreboard: Scoreboard,
    sink: ShardSink,
    options: TransferOptions,
    emit: EventSink = no_events,
    unusable: Collection[str] = (),
) -> None:
    """Fetch and verify every shard in ``pending``; raise a PrimeError once one cannot be had.

    ``unusable`` sources are never asked (they hold another version under this number, e.g. another run's)."""
    if not pending:
        return
    await _ShardFetch(fetcher, manifest, pending, scoreboard, sink, options, emit, unusable).run()


@dataclass(eq=False)
class _ShardFetch:
    """One run of :func:`fetch_shards`: the queue of shards and the state its workers share."""

    fetcher: ShardFetcher
    manifest: PolicyManifest
    pending: Sequence[ShardEntry]
    scoreboard: Scoreboard
    sink: ShardSink
    options: TransferOptions
    emit: EventSink
    unusable: Collection[str]

    def __post_init__(self) -> None:
        """Set up the per-shard bookkeeping and queue every pending shard (inside the running event loop)."""
        pending = self.pending
        self.queue: asyncio.PriorityQueue[tuple[float, int, int]] = asyncio.PriorityQueue()
        self.order = itertools.count()
        self.loop = asyncio.get_running_loop()
        self.deadline = progress_deadline(self.options)
        self.attempts = dict.fromkeys((shard.index for shard in pending), 0)
        self.excluded: dict[int, set[str]] = {shard.index: set(self.unusable) for shard in pending}
        self.kinds_seen: dict[int, set[FailureKind]] = {shard.index: set() for shard in pending}
        self.num_not_ready = dict.fromkeys(self.attempts, 0)
        self.last_progress = self.loop.time()
        self.remaining = len(pending)
        self.hedges_in_flight = 0
        self.in_flight: set[_Attempt] = set()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        for shard in pending:
            self.requeue(shard.index, 0.0)

    async def run(self) -> None:
        """Run the workers until every shard verified or the transfer was given up; then stop them."""
        num_workers = min(self.options.num_parallel, len(self.pending))
        workers = [asyncio.create_task(self.guarded_worker()) for _ in range(num_workers)]
        try:
            await self.finished
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    def requeue(self, index: int, delay_s: float) -> None:
        """Put shard ``index`` back on the queue, to be taken again in ``delay_s`` seconds."""
        self.queue.put_nowait((self.loop.time() + delay_s, next(self.order), index))

    def give_up(self, error: PrimeError) -> None:
        """End the transfer with ``error`` (the first one given wins)."""
        if not self.finished.done():
            self.finished.set_exception(error)

    def hedge_delay(self, shard: ShardEntry) -> float:
        """How long a fetch of ``shard`` may run before it is hedged."""
        measured = [s.throughput_bps for s in self.scoreboard.sources.values() if s.throughput_bps]
        expected = shard.size_bytes / max(measured) if measured else 0.0
        return max(self.options.hedge_after_s, self.options.hedge_factor * expected)

    def start(self, attempt: _Attempt, shard: ShardEntry) -> None:
        """Start ``attempt`` as a task fetching ``shard``."""
        self.scoreboard.started(attempt.source)
        self.in_flight.add(attempt)
        attempt.task = asyncio.create_task(
            fetch_shard(self.fetcher, attempt.source, self.manifest, shard, self.sink, self.deadline, attempt)
        )

    async def guarded_worker(self) -> None:
        """Run a worker; whatever it raises (but a cancellation) ends the transfer instead of hanging it."""
        try:
            await self.worker()
        except asyncio.CancelledError:
            raise
        except PrimeError as exc:  # a local fault (disk full, read-only): stop at once, say what to do
            self.give_up(exc)
        except Exception as exc:  # a bug: stop the transfer, never hang it
            self.give_up(
                PrimeError(f"transfer of version {self.manifest.version} stopped: {type(exc).__name__}: {exc}")
            )

    async def worker(self) -> None:
        """Take shards off the queue and fetch each from a chosen source, until this worker gives up."""
        while True:
            ready_at, _, index = await self.queue.get()
            delay = ready_at - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            shard = self.manifest.shards[index]
            source = self.scoreboard.choose(exclude=self.excluded[index])
            if source is None:
                wait_s = self.scoreboard.next_ready_in(exclude=self.excluded[index])
                if wait_s is None:
                    self.give_up(_no_source_left(self.manifest.version, index, self.kinds_seen[index], self.scoreboard))
                    return
                self.requeue(index, wait_s + 0.01)
                continue
            winner, failures = await self.fetch_hedged(shard, source)
            if winner is not None:
                self.shard_done(shard, winner)
            elif not self.retry(index, failures):
                return

    def shard_done(self, shard: ShardEntry, winner: _Attempt) -> None:
        """Count ``shard`` as verified (by ``winner``); the last one ends the transfer."""
        self.emit(
            {
                "event": "shard_done",
                "version": self.manifest.version,
                "index": shard.index,
                "source": winner.source,
                "bytes": shard.size_bytes,
                "seconds": round(time.monotonic() - winner.started, 4),
                "hedged": winner.hedge,
            }
        )
        self.remaining -= 1
        self.last_progress = self.loop.time()
        if self.remaining == 0 and not self.finished.done():
            self.finished.set_result(None)

    def retry(self, index: int, failures: list[tuple[str, ShardFetchError]]) -> bool:
        """Queue shard ``index`` again after every fetch of it failed; False once the transfer is given up."""
        if all(failure.kind == "not_ready" for _, failure in failures):
            return self.retry_not_ready(index, failures)
        self.exclude_failed(index, failures)
        self.attempts[index] += 1
        attempts = self.attempts[index]
        if attempts >= self.options.max_attempts_per_shard:
            kinds = self.kinds_seen[index]
            self.give_up(_no_source_left(self.manifest.version, index, kinds, self.scoreboard, attempts))
            return False
        self.requeue(index, min(self.options.backoff_max_s, self.options.backoff_base_s * 2 ** (attempts - 1)))
        return True

    def retry_not_ready(self, index: int, failures: list[tuple[str, ShardFetchError]]) -> bool:
        """Ask again later for a shard not mirrored yet, unless none verified for too long: then give up."""
        waited_s = self.loop.time() - self.last_progress
        if waited_s > self.options.not_ready_timeout_s:
            self.give_up(_never_ready(self.manifest.version, index, waited_s, [source for source, _ in failures]))
            return False
        self.num_not_ready[index] += 1
        delay_s = self.options.not_ready_retry_s * 2 ** min(self.num_not_ready[index] - 1, 16)
        self.requeue(index, min(self.options.backoff_max_s, delay_s))
        return True

    def exclude_failed(self, index: int, failures: list[tuple[str, ShardFetchError]]) -> None:
        """Keep the sources that failed shard ``index`` from it; once none is left, let the healthy ones try again."""
        excluded = self.excluded[index]
        for failed_source, failure in failures:
            if failure.kind == "not_ready":
                continue
            self.kinds_seen[index].add(failure.kind)
            if failure.kind in ("integrity", "missing") or len(self.scoreboard.sources) > 1:
                excluded.add(failed_source)
        if not self.scoreboard.usable(exclude=excluded):
            excluded.clear()  # every source failed once: let the healthy ones try again
            excluded.update(url for url in self.scoreboard.sources if self.scoreboard.is_banned(url))
            excluded.update(self.unusable)

    async def fetch_hedged(
        self, shard: ShardEntry, source: str
    ) -> tuple[_Attempt | None, list[tuple[str, ShardFetchError]]]:
        """Fetch ``shard`` from ``source``, hedged to another source if it drags: (winner, failures)."""
        running = [_Attempt(source, hedge=False)]
        self.start(running[0], shard)
        failures: list[tuple[str, ShardFetchError]] = []
        may_hedge = len(self.scoreboard.sources) > 1 and self.options.max_hedges > 0
        hedge_at = running[0].started + self.hedge_delay(shard)
        try:
            while running:
                timeout = max(0.0, hedge_at - time.monotonic()) if may_hedge else None
                tasks = {attempt.task for attempt in running if attempt.task is not None}
                done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    next_hedge_at = self.hedge_if_dragging(shard, running)
                    if next_hedge_at is None:
                        may_hedge = False
                    else:
                        hedge_at = next_hedge_at
                    continue
                winner = self.settle(shard, running, done, failures)
                if winner is not None:
                    return winner, failures
            return None, failures
        finally:
            await self.stop(running)

    def hedge_if_dragging(self, shard: ShardEntry, running: list[_Attempt]) -> float | None:
        """Hedge the primary ``running[0]`` if it drags: None once hedged, else when to look again."""
        if not is_dragging(running[0], list(self.in_flight), time.monotonic()):
            # slow, but no slower than the other sources: the shared link is the limit, not the source
            return time.monotonic() + self.hedge_delay(shard)
        busy = {attempt.source for attempt in running}
        other = self.scoreboard.choose(exclude=self.excluded[shard.index] | busy)
        if other is None or self.hedges_in_flight >= self.options.max_hedges:
            # every hedge slot is taken (or every other source cools down): try again shortly,
            # never wait out the dragging primary's whole response timeout
            return time.monotonic() + _HEDGE_RETRY_S
        hedge = _Attempt(other, hedge=True)
        self.hedges_in_flight += 1
        self.start(hedge, shard)
        running.append(hedge)
        self.emit(
            {
                "event": "shard_hedged",
                "version": self.manifest.version,
                "index": shard.index,
                "source": other,
                "slow_source": running[0].source,
            }
        )
        return None

    def settle(
        self,
        shard: ShardEntry,
        running: list[_Attempt],
        done: Collection[asyncio.Task[None]],
        failures: list[tuple[str, ShardFetchError]],
    ) -> _Attempt | None:
        """Take the ``done`` attempts out of ``running`` and score them: the first that verified wins."""
        for attempt in [a for a in running if a.task in done]:
            running.remove(attempt)
            self.in_flight.discard(attempt)
            if attempt.hedge:
                self.hedges_in_flight -= 1
            assert attempt.task is not None
            error = attempt.task.exception()
            if error is None:
                self.record_win(shard, attempt, running)
                return attempt
            if not isinstance(error, ShardFetchError):
                raise error
            self.scoreboard.record(
                attempt.source,
                _OUTCOME[error.kind],
                attempt.received,
                time.monotonic() - attempt.started,
                error=error.reason,
            )
            self.emit(_failure_event(self.manifest.version, shard.index, attempt.source, error))
            failures.append((attempt.source, error))
        return None

    def record_win(self, shard: ShardEntry, winner: _Attempt, losers: Sequence[_Attempt]) -> None:
        """Score ``winner`` ok and the ``losers`` it outran: a primary beaten by its hedge is demoted."""
        seconds = time.monotonic() - winner.started
        self.scoreboard.record(winner.source, "ok", shard.size_bytes, seconds)
        for loser in losers:
            outcome: Outcome = "cancelled" if loser.hedge else "slow"
            self.scoreboard.record(
                loser.source,
                outcome,
                loser.received,
                time.monotonic() - loser.started,
                error=f"outrun by {winner.source} on shard {shard.index}",
            )

    async def stop(self, running: list[_Attempt]) -> None:
        """Cancel the attempts still ``running`` and wait for them to end."""
        for attempt in running:
            self.in_flight.discard(attempt)
            if attempt.task is not None and not attempt.task.done():
                attempt.task.cancel()
            if attempt.hedge:
                self.hedges_in_flight -= 1
        await asyncio.gather(*(a.task for a in running if a.task is not None), return_exceptions=True)


def _failure_event(version: int, index: int, source: str, failure: ShardFetchError) -> dict[str, Any]:
    return {
        "event": "shard_retry" if failure.kind == "not_ready" else "shard_failed",
        "version": version,
        "index": index,
        "source": source,
        "kind": failure.kind,
        "reason": failure.reason,
    }


def _never_ready(version: int, index: int, waited_s: float, sources: Sequence[str]) -> PrimeError:
    return RemoteUnavailableError(
        f"no shard of version {version} verified for {waited_s:.0f} s while {', '.join(sources)} kept answering "
        f"503 for shard {index} (not mirrored yet); the relay may have lost its upstream: try again later or "
        "name another relay"
    )


def _no_source_left(
    version: int, index: int, kinds: set[FailureKind], scoreboard: Scoreboard, num_attempts: int | None = None
) -> PrimeError:
    errors = "; ".join(f"{s.url}: {s.last_error or 'ok'}" for s in scoreboard.sources.values())
    tried = f"after {num_attempts} attempts" if num_attempts else "with no usable source left"
    message = f"shard {index} of version {version} could not be fetched {tried} ({errors})"
    if kinds == {"missing"}:
        return NotFoundError(message)
    if "integrity" in kinds or any(scoreboard.is_banned(url) for url in scoreboard.sources):
        return IntegrityError(message)
    return RemoteUnavailableError(message)
