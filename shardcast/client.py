"""The SHARDCAST client: download one policy version from several relays, verified, resumable, atomic.

What the worker and the validator call::

    path = download_version(7, ["http://relay-a:8100", "http://relay-b:8100"], coordinator_id, Path("policies"))
    # -> policies/v7/, the checkpoint's files, every byte checked against the coordinator's signature

(or ``await fetch_version(...)`` from async code). Steps:

1. The manifest is taken from the first relay whose copy the coordinator signed; relays
   serving a forged one are banned for this download.
2. The files are preallocated under ``dest_root/.partial-v{N}/`` and each shard, fetched by
   the shared engine (:mod:`shardcast.transfer`: parallel, spread over all relays by measured
   throughput, per-shard failover, bounded retries with backoff), is written straight into its
   place in those files while it is hashed. Nothing is copied twice.
3. An interrupted download resumes: the partial directory keeps the manifest, and on the next
   run every shard already on disk is re-hashed and kept if it matches.
4. When every shard verified, the files are synced and the directory is renamed to
   ``dest_root/v{N}``: a reader sees the whole version or nothing.

Events (``on_event``, one dict each: ``start``, ``manifest``, ``shard_done``, ``shard_failed``,
``shard_retry``, ``done``) feed the progress bar of ``prime-relay fetch`` and its ``--json-events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pydantic

from protocol.errors import IntegrityError, NotFoundError, PrimeError, RemoteUnavailableError
from protocol.schemas import PolicyManifest, ShardEntry, SignedManifest, VersionsResponse
from shardcast.fetchers import ShardFetcher, get_bytes, open_fetcher
from shardcast.manifest import LOCAL_MANIFEST_NAME, FileSpan, load_verified_manifest, new_hasher, shard_spans
from shardcast.scoring import Scoreboard
from shardcast.transfer import EventSink, ShardWriter, TransferOptions, fetch_shards, no_events

PARTIAL_PREFIX = ".partial-v"
_HASH_CHUNK_BYTES = 8 * 1024 * 1024


def version_path(dest_root: Path, version: int) -> Path:
    """Where a finished version lives."""
    return dest_root / f"v{version}"


class _PreallocatedFiles:
    """The version's files under the partial directory, open for positioned writes."""

    def __init__(self, root: Path, manifest: PolicyManifest, create: bool) -> None:
        self.fds: dict[str, int] = {}
        for entry in manifest.files:
            path = root / entry.path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self.fds[entry.path] = fd
            if os.fstat(fd).st_size != entry.size_bytes or create:
                os.ftruncate(fd, entry.size_bytes)
                if entry.size_bytes and hasattr(os, "posix_fallocate"):
                    # filesystems without fallocate: the truncate already sized the file
                    with contextlib.suppress(OSError):
                        os.posix_fallocate(fd, 0, entry.size_bytes)

    def write(self, spans: Sequence[FileSpan], offset: int, data: bytes | memoryview) -> None:
        """Write ``data``, which starts ``offset`` bytes into the range the ``spans`` describe."""
        view = memoryview(data)
        end = offset + len(view)
        for span in spans:
            lo = max(offset, span.range_offset)
            hi = min(end, span.range_offset + span.length)
            if lo < hi:
                os.pwrite(
                    self.fds[span.path], view[lo - offset : hi - offset], span.file_offset + lo - span.range_offset
                )

    def matches(self, manifest: PolicyManifest, shard: ShardEntry) -> bool:
        hasher = new_hasher(manifest.hash_algorithm)
        for span in shard_spans(manifest, shard):
            position, left = span.file_offset, span.length
            while left > 0:
                chunk = os.pread(self.fds[span.path], min(left, _HASH_CHUNK_BYTES), position)
                if not chunk:
                    return False
                hasher.update(chunk)
                position += len(chunk)
                left -= len(chunk)
        return hasher.hexdigest() == shard.hash

    def close(self, sync: bool) -> None:
        for fd in self.fds.values():
            if sync:
                os.fsync(fd)
            os.close(fd)
        self.fds.clear()


class _InPlaceWriter:
    def __init__(self, files: _PreallocatedFiles, spans: list[FileSpan]) -> None:
        self.files = files
        self.spans = spans

    def write(self, offset: int, data: memoryview) -> None:
        self.files.write(self.spans, offset, data)

    def commit(self) -> None:
        """The bytes are already in place; verification was all that was missing."""

    def discard(self) -> None:
        """Wrong bytes stay until the retry overwrites them; the shard is not marked done."""


class _InPlaceSink:
    def __init__(self, files: _PreallocatedFiles, manifest: PolicyManifest) -> None:
        self.files = files
        self.manifest = manifest

    def open_shard(self, shard: ShardEntry) -> ShardWriter:
        return _InPlaceWriter(self.files, shard_spans(self.manifest, shard))


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One downloader per version and destination at a time (others wait)."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_local_manifest(directory: Path, coordinator_id: str, version: int) -> SignedManifest | None:
    try:
        return load_verified_manifest((directory / LOCAL_MANIFEST_NAME).read_bytes(), coordinator_id, version)
    except (OSError, IntegrityError):
        return None


MAX_MANIFEST_BYTES = 512 * 1024 * 1024


async def fetch_manifest(
    fetcher: ShardFetcher,
    scoreboard: Scoreboard,
    version: int,
    coordinator_id: str,
    emit: EventSink = no_events,
) -> tuple[bytes, SignedManifest]:
    """The version's manifest from the best relay that serves one the coordinator signed."""
    problems: list[str] = []
    missing = 0
    for relay in scoreboard.ranked():
        try:
            status, raw = await get_bytes(fetcher, f"{relay}/v/{version}/manifest.json", MAX_MANIFEST_BYTES)
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            scoreboard.record(relay, "network", error=str(exc))
            problems.append(f"{relay}: {type(exc).__name__}")
            continue
        if status == 404:
            missing += 1
            problems.append(f"{relay}: does not hold version {version}")
            continue
        if status != 200:
            scoreboard.record(relay, "network", error=f"HTTP {status}")
            problems.append(f"{relay}: HTTP {status}")
            continue
        try:
            signed = load_verified_manifest(raw, coordinator_id, version)
        except IntegrityError as exc:
            scoreboard.record(relay, "integrity", error=exc.message)
            emit({"event": "manifest_refused", "version": version, "source": relay, "reason": exc.message})
            problems.append(f"{relay}: {exc.message}")
            continue
        return raw, signed
    summary = "; ".join(problems) or "no relay left to ask"
    if missing == len(scoreboard.sources):
        raise NotFoundError(f"no relay holds version {version} ({summary})")
    if any(scoreboard.is_banned(url) for url in scoreboard.sources):
        raise IntegrityError(f"no relay served a manifest for version {version} signed by {coordinator_id} ({summary})")
    raise RemoteUnavailableError(f"could not get the manifest of version {version} ({summary})")


async def fetch_version(
    version: int,
    relays: Sequence[str],
    coordinator_id: str,
    dest_root: Path,
    options: TransferOptions | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    on_event: EventSink | None = None,
) -> Path:
    """Download ``version`` from ``relays`` into ``dest_root/v{version}`` (see the module docstring)."""
    if not relays:
        raise RemoteUnavailableError("no relay given; pass at least one relay URL")
    options = options or TransferOptions()
    sink = on_event or no_events

    def emit(event: dict[str, Any]) -> None:
        sink({**event, "ts": round(time.time(), 3)})

    dest_root.mkdir(parents=True, exist_ok=True)
    final = version_path(dest_root, version)
    started = time.monotonic()
    emit({"event": "start", "version": version, "relays": list(relays), "dest": str(final)})
    with _exclusive(dest_root / f".lock-v{version}"):
        if _read_local_manifest(final, coordinator_id, version) is not None:
            emit({"event": "done", "version": version, "path": str(final), "seconds": 0.0, "bytes": 0, "cached": True})
            return final
        urls = [url.rstrip("/") for url in relays]
        scoreboard = Scoreboard(urls, backoff_base_s=options.backoff_base_s)
        fetcher = open_fetcher(
            urls, transport, options.connect_timeout_s, options.read_timeout_s, 2 * options.num_parallel
        )
        try:
            raw, signed = await fetch_manifest(fetcher, scoreboard, version, coordinator_id, emit)
            partial = dest_root / f"{PARTIAL_PREFIX}{version}"
            await _download_into(partial, raw, signed.manifest, coordinator_id, fetcher, scoreboard, options, emit)
        finally:
            await fetcher.aclose()
        if final.exists():  # left by something else and not a verified version: set it aside
            os.rename(final, dest_root / f".stale-v{version}-{int(time.time())}")
        os.rename(partial, final)
        emit(
            {
                "event": "done",
                "version": version,
                "path": str(final),
                "seconds": round(time.monotonic() - started, 3),
                "bytes": signed.manifest.total_size_bytes,
                "cached": False,
                "relays": scoreboard.snapshot(),
            }
        )
        return final


async def _download_into(
    partial: Path,
    raw_manifest: bytes,
    manifest: PolicyManifest,
    coordinator_id: str,
    fetcher: ShardFetcher,
    scoreboard: Scoreboard,
    options: TransferOptions,
    emit: EventSink,
) -> None:
    """Fill ``partial`` with the verified version, resuming what an earlier attempt left there."""
    previous = _read_local_manifest(partial, coordinator_id, manifest.version)
    resuming = previous is not None and previous.manifest == manifest
    if not resuming:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        (partial / LOCAL_MANIFEST_NAME).write_bytes(raw_manifest)
    files = _PreallocatedFiles(partial, manifest, create=not resuming)
    synced = False
    try:
        done = set()
        if resuming:
            checks = await asyncio.gather(*(asyncio.to_thread(files.matches, manifest, s) for s in manifest.shards))
            done = {shard.index for shard, ok in zip(manifest.shards, checks, strict=True) if ok}
        pending = [shard for shard in manifest.shards if shard.index not in done]
        emit(
            {
                "event": "manifest",
                "version": manifest.version,
                "num_shards": len(manifest.shards),
                "total_bytes": manifest.total_size_bytes,
                "num_shards_resumed": len(done),
                "bytes_resumed": sum(manifest.shards[i].size_bytes for i in done),
            }
        )
        await fetch_shards(fetcher, manifest, pending, scoreboard, _InPlaceSink(files, manifest), options, emit)
        await asyncio.to_thread(files.close, options.fsync_enabled)
        synced = True
    finally:
        if not synced:
            files.close(sync=False)


def download_version(
    version: int,
    relays: Sequence[str],
    coordinator_id: str,
    dest_root: Path,
    options: TransferOptions | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    on_event: EventSink | None = None,
) -> Path:
    """Blocking form of :func:`fetch_version`, for code without an event loop."""
    return asyncio.run(fetch_version(version, relays, coordinator_id, dest_root, options, transport, on_event))


async def latest_version(
    relays: Sequence[str], transport: httpx.AsyncBaseTransport | None = None, timeout_s: float = 10.0
) -> int:
    """The newest version any relay lists (a hint: the download still verifies the manifest)."""

    async def ask(http: httpx.AsyncClient, relay: str) -> int | None:
        try:
            response = await http.get(f"{relay.rstrip('/')}/versions")
            response.raise_for_status()
            return VersionsResponse.model_validate_json(response.content).latest
        except (httpx.HTTPError, pydantic.ValidationError):
            return None

    async with httpx.AsyncClient(timeout=timeout_s, transport=transport) as http:
        answers = await asyncio.gather(*(ask(http, relay) for relay in relays))
    known = [answer for answer in answers if answer is not None]
    if not known:
        raise RemoteUnavailableError(f"no relay answered /versions with a version ({', '.join(relays)})")
    return max(known)


def describe_failure(exc: PrimeError) -> dict[str, Any]:
    """The JSON event for a download that failed."""
    return {"event": "error", "error": exc.code, "detail": exc.message}
