"""Fetching the shards of one version from several untrusted sources at once, verifying each.

The one engine behind both the relay (mirroring from upstreams) and the client (downloading
from relays). ``num_parallel`` tasks take shards from a queue; each picks a source from the
:class:`~shardcast.scoring.Scoreboard`, streams ``GET {source}/v/{N}/shards/{i}`` (through a
:class:`~shardcast.fetchers.ShardFetcher`) into a
:class:`ShardSink`, hashing as the bytes arrive, and commits the shard only when its hash is
the one the coordinator signed. A failed shard goes back on the queue with exponential
backoff and another source is tried (the failing one is excluded for that shard); after
``max_attempts_per_shard`` failures the whole transfer fails. A relay answering 503 (it is
still mirroring that shard) costs no attempt: the shard is simply asked for again shortly.
A source that sends bytes that do not match is banned by the scoreboard.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field

from protocol.errors import IntegrityError, NotFoundError, PrimeError, RemoteUnavailableError
from protocol.schemas import PolicyManifest, ShardEntry
from shardcast.fetchers import ShardFetcher
from shardcast.manifest import new_hasher
from shardcast.scoring import Outcome, Scoreboard

EventSink = Callable[[dict[str, Any]], None]
FailureKind = Literal["network", "not_ready", "integrity", "missing"]


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
    """Delay before asking again for a shard a relay has not mirrored yet."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Time to open a connection to a source."""
    read_timeout_s: float = Field(default=60.0, gt=0)
    """Longest silence while reading a response (relays may hold a shard request while mirroring it)."""
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
    def open_shard(self, shard: ShardEntry) -> ShardWriter: ...


class ShardFetchError(Exception):
    """One fetch of one shard from one source failed (kept inside the engine)."""

    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def http_timeout(options: TransferOptions) -> httpx.Timeout:
    return httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s)


def shard_url(source: str, version: int, index: int) -> str:
    return f"{source.rstrip('/')}/v/{version}/shards/{index}"


async def fetch_shard(
    fetcher: ShardFetcher,
    source: str,
    manifest: PolicyManifest,
    shard: ShardEntry,
    sink: ShardSink,
) -> None:
    """Stream one shard from ``source`` into ``sink`` and commit it only if its hash matches."""
    writer = sink.open_shard(shard)
    committed = False
    try:
        await _stream_verified(fetcher, source, manifest, shard, writer)
        writer.commit()
        committed = True
    finally:
        if not committed:
            writer.discard()


async def _stream_verified(
    fetcher: ShardFetcher, source: str, manifest: PolicyManifest, shard: ShardEntry, writer: ShardWriter
) -> None:
    url = shard_url(source, manifest.version, shard.index)
    hasher = new_hasher(manifest.hash_algorithm)
    received = 0

    def consume(chunk: memoryview) -> None:
        nonlocal received
        if received + len(chunk) > shard.size_bytes:
            raise ShardFetchError("integrity", f"{url}: more than the {shard.size_bytes} bytes signed")
        hasher.update(chunk)
        writer.write(received, chunk)
        received += len(chunk)

    try:
        status = await fetcher.get(url, consume)
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        raise ShardFetchError("network", f"{url}: {type(exc).__name__}: {exc}") from exc
    if status == 503:
        raise ShardFetchError("not_ready", f"{url}: not mirrored yet")
    if status == 404:
        raise ShardFetchError("missing", f"{url}: 404 (source does not hold this version)")
    if status != 200:
        raise ShardFetchError("network", f"{url}: HTTP {status}")
    if received != shard.size_bytes:
        raise ShardFetchError("network", f"{url}: got {received} of {shard.size_bytes} bytes")
    digest = hasher.hexdigest()
    if digest != shard.hash:
        raise ShardFetchError("integrity", f"{url}: {manifest.hash_algorithm} {digest[:16]}... is not the signed hash")


_OUTCOME: dict[FailureKind, Outcome] = {
    "network": "network",
    "not_ready": "not_ready",
    "integrity": "integrity",
    "missing": "network",
}


async def fetch_shards(
    fetcher: ShardFetcher,
    manifest: PolicyManifest,
    pending: Sequence[ShardEntry],
    scoreboard: Scoreboard,
    sink: ShardSink,
    options: TransferOptions,
    emit: EventSink = no_events,
) -> None:
    """Fetch and verify every shard in ``pending``; raise a PrimeError once one cannot be had."""
    if not pending:
        return
    queue: asyncio.PriorityQueue[tuple[float, int, int]] = asyncio.PriorityQueue()
    order = itertools.count()
    loop = asyncio.get_running_loop()
    attempts = dict.fromkeys((shard.index for shard in pending), 0)
    excluded: dict[int, set[str]] = {shard.index: set() for shard in pending}
    kinds_seen: dict[int, set[FailureKind]] = {shard.index: set() for shard in pending}
    remaining = len(pending)
    finished = loop.create_future()

    def requeue(index: int, delay_s: float) -> None:
        queue.put_nowait((loop.time() + delay_s, next(order), index))

    def give_up(error: PrimeError) -> None:
        if not finished.done():
            finished.set_exception(error)

    for shard in pending:
        requeue(shard.index, 0.0)

    async def worker() -> None:
        nonlocal remaining
        while True:
            ready_at, _, index = await queue.get()
            delay = ready_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            shard = manifest.shards[index]
            source = scoreboard.choose(exclude=excluded[index])
            if source is None:
                wait_s = scoreboard.next_ready_in(exclude=excluded[index])
                if wait_s is None:
                    give_up(_no_source_left(manifest.version, index, kinds_seen[index], scoreboard))
                    return
                requeue(index, wait_s + 0.01)
                continue
            scoreboard.started(source)
            started = time.monotonic()
            try:
                await fetch_shard(fetcher, source, manifest, shard, sink)
            except ShardFetchError as failure:
                scoreboard.record(source, _OUTCOME[failure.kind], error=failure.reason)
                emit(_failure_event(manifest.version, index, source, failure))
                if failure.kind == "not_ready":
                    requeue(index, options.not_ready_retry_s)
                    continue
                kinds_seen[index].add(failure.kind)
                if failure.kind in ("integrity", "missing") or len(scoreboard.sources) > 1:
                    excluded[index].add(source)
                if not scoreboard.usable(exclude=excluded[index]):
                    excluded[index].clear()  # every source failed once: let the healthy ones try again
                    excluded[index].update(url for url in scoreboard.sources if scoreboard.is_banned(url))
                attempts[index] += 1
                if attempts[index] >= options.max_attempts_per_shard:
                    give_up(_no_source_left(manifest.version, index, kinds_seen[index], scoreboard, attempts[index]))
                    return
                requeue(index, min(options.backoff_max_s, options.backoff_base_s * 2 ** (attempts[index] - 1)))
                continue
            seconds = time.monotonic() - started
            scoreboard.record(source, "ok", shard.size_bytes, seconds)
            emit(
                {
                    "event": "shard_done",
                    "version": manifest.version,
                    "index": index,
                    "source": source,
                    "bytes": shard.size_bytes,
                    "seconds": round(seconds, 4),
                }
            )
            remaining -= 1
            if remaining == 0 and not finished.done():
                finished.set_result(None)

    async def guarded_worker() -> None:
        try:
            await worker()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a local failure (disk full, a bug): stop the transfer, never hang it
            give_up(PrimeError(f"transfer of version {manifest.version} stopped: {type(exc).__name__}: {exc}"))

    workers = [asyncio.create_task(guarded_worker()) for _ in range(min(options.num_parallel, len(pending)))]
    try:
        await finished
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def _failure_event(version: int, index: int, source: str, failure: ShardFetchError) -> dict[str, Any]:
    return {
        "event": "shard_retry" if failure.kind == "not_ready" else "shard_failed",
        "version": version,
        "index": index,
        "source": source,
        "kind": failure.kind,
        "reason": failure.reason,
    }


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
