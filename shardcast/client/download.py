"""The SHARDCAST client: download one policy version from several relays, verified, resumable, atomic.

What the worker and the validator call::

    path = download_version(7, ["http://relay-a:8100", "http://relay-b:8100"], coordinator_id, Path("policies"))
    # -> policies/v7/, the checkpoint's files, every byte checked against the coordinator's signature

(or ``await fetch_version(...)`` from async code). Steps:

1. The manifest is taken from the first relay whose copy the coordinator signed; relays
   serving a forged one are banned for this download.
2. The files are preallocated under ``dest_root/.partial-v{N}/`` and each shard, fetched by
   the shared engine (:mod:`shardcast.client.transfer`: parallel, spread over all relays by measured
   throughput, per-shard failover, bounded retries with backoff), is written straight into its
   place in those files while it is hashed. Nothing is copied twice.
3. An interrupted download resumes: the partial directory keeps the manifest, and on the next
   run every shard already on disk is re-hashed and kept if it matches.
4. When every shard verified, the files are synced and the directory is renamed to
   ``dest_root/v{N}``: a reader sees the whole version or nothing.

A slow relay costs little: the manifest request is hedged to the next relay after
``hedge_after_s``, shard requests are hedged by the engine, and every request runs under a
progress deadline (see :mod:`shardcast.client.transfer`). A local fault (no space, read-only,
permissions) raises :class:`~protocol.errors.LocalFaultError` at once; the partial directory
keeps what verified, and no version is exposed.

A *patch* version (a value patch against a base version, :mod:`shardcast.format.patch`) is rebuilt
instead: :meth:`_ChainDownload.plan` walks the signed manifests down the chain of bases to the first
version held under ``dest_root`` (then only the patches after it are downloaded) or, failing
that, to the newest full version (downloaded first, then the patches after it). Each patch is
downloaded like any version (every shard verified), applied to its base into a scratch
directory, and the result is checked file by file against the signed ``result_files`` (size and
hash) before it is renamed to ``dest_root/v{N}``; each version rebuilt on the way is exposed
the same way. A patch that does not rebuild its signed result makes the client re-hash the base
it used: a damaged local base is removed and the version planned again (from an older held
version or a full one); an intact base means the signed patch itself is wrong, and the version
is refused (:class:`~protocol.errors.VersionRefusedError`, an IntegrityError), never exposed.

Versions never go back: every verified manifest newer than the last is kept as
``dest_root/.shardcast-newest.json``, and :func:`newest_known` (that, or the newest version
held) is the floor below which "latest" never resolves, whatever a relay lists.

Events (``on_event``, one dict each: ``start``, ``manifest``, ``shard_done``, ``shard_failed``,
``shard_retry``, ``shard_hedged``, ``manifest_refused``, ``manifest_other_run``, ``plan``, ``patch_refused``,
``base_damaged``, ``version_ready``, ``done``) feed the progress bar of ``prime-relay fetch`` and
its ``--json-events``; ``done`` says ``kind`` (full or patch) and, for a patch, the ``base`` it
started from, the ``chain`` applied, the ``bytes`` downloaded and the ``bytes_saved``.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pydantic

from protocol.errors import (
    IntegrityError,
    NotFoundError,
    OtherRunError,
    PrimeError,
    RemoteUnavailableError,
    VersionRefusedError,
)
from protocol.schemas import PolicyManifest, ShardEntry, SignedManifest, VersionsResponse
from shardcast.client.fetchers import ShardFetcher, get_bounded, get_bytes, open_fetcher
from shardcast.client.progress import TooSlowError, prompt_answers
from shardcast.client.scoring import Outcome, Scoreboard
from shardcast.client.transfer import (
    EventSink,
    ShardWriter,
    TransferOptions,
    fetch_shards,
    no_events,
    progress_deadline,
)
from shardcast.format.manifest import (
    LOCAL_MANIFEST_NAME,
    MAX_LISTING_BYTES,
    MAX_MANIFEST_BYTES,
    FileSpan,
    load_verified_manifest,
    new_hasher,
    result_mismatch,
    shard_spans,
)
from shardcast.format.store import fsync_file, local_disk, pwrite_all, write_file_atomically

PARTIAL_PREFIX = ".partial-v"
NEWEST_SEEN_NAME = ".shardcast-newest.json"
"""The newest signed manifest a download verified under a destination: "latest" never goes below it."""
_HASH_CHUNK_BYTES = 8 * 1024 * 1024
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def version_path(dest_root: Path, version: int) -> Path:
    """Where a finished version lives."""
    return dest_root / f"v{version}"


class _PreallocatedFiles:
    """The version's files under the partial directory, open for positioned writes."""

    def __init__(self, root: Path, manifest: PolicyManifest, create: bool) -> None:
        self.fds: dict[str, int] = {}
        try:
            for entry in manifest.files:
                path = root / entry.path
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                self.fds[entry.path] = fd
                if os.fstat(fd).st_size != entry.size_bytes or create:
                    os.ftruncate(fd, entry.size_bytes)
                    if entry.size_bytes and hasattr(os, "posix_fallocate"):
                        try:  # reserve the space now: a full disk shows up before any byte is fetched
                            os.posix_fallocate(fd, 0, entry.size_bytes)
                        except OSError as exc:
                            if exc.errno not in _NO_FALLOCATE:  # no fallocate here: the truncate sized the file
                                raise
        except BaseException:
            self.close(sync=False)
            raise

    def write(self, spans: Sequence[FileSpan], offset: int, data: bytes | memoryview) -> None:
        """Write ``data``, which starts ``offset`` bytes into the range the ``spans`` describe."""
        view = memoryview(data)
        end = offset + len(view)
        for span in spans:
            lo = max(offset, span.range_offset)
            hi = min(end, span.range_offset + span.length)
            if lo < hi:
                pwrite_all(
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
    """The first writer of a shard: bytes go straight into their place in the files."""

    def __init__(self, sink: _InPlaceSink, shard: ShardEntry, spans: list[FileSpan]) -> None:
        self.sink = sink
        self.index = shard.index
        self.spans = spans

    def write(self, offset: int, data: memoryview) -> None:
        if self.index not in self.sink.finished:  # a hedge already placed verified bytes: leave them
            self.sink.files.write(self.spans, offset, data)

    def commit(self) -> None:
        """The bytes are already in place; verification was all that was missing."""
        self.sink.finished.add(self.index)
        self.sink.writing.discard(self.index)

    def discard(self) -> None:
        """Wrong bytes stay until a retry or the hedge overwrites them; the shard is not marked done."""
        self.sink.writing.discard(self.index)


class _BufferedWriter:
    """A hedge of a shard already being written in place: kept in memory, placed only once verified."""

    def __init__(self, sink: _InPlaceSink, shard: ShardEntry, spans: list[FileSpan]) -> None:
        self.sink = sink
        self.index = shard.index
        self.spans = spans
        self.buffer = bytearray(shard.size_bytes)

    def write(self, offset: int, data: memoryview) -> None:
        self.buffer[offset : offset + len(data)] = data

    def commit(self) -> None:
        if self.index not in self.sink.finished:
            self.sink.files.write(self.spans, 0, memoryview(self.buffer))
            self.sink.finished.add(self.index)

    def discard(self) -> None:
        self.buffer = bytearray()


class _InPlaceSink:
    def __init__(self, files: _PreallocatedFiles, manifest: PolicyManifest, location: Path) -> None:
        self.files = files
        self.manifest = manifest
        self.location = location
        self.writing: set[int] = set()
        """Shards with an in-place writer open (a second fetch of one, a hedge, is buffered)."""
        self.finished: set[int] = set()

    def open_shard(self, shard: ShardEntry) -> ShardWriter:
        spans = shard_spans(self.manifest, shard)
        if shard.index in self.writing:
            return _BufferedWriter(self, shard, spans)
        self.writing.add(shard.index)
        return _InPlaceWriter(self, shard, spans)


_LOCK_POLL_S = 0.05


@asynccontextmanager
async def _exclusive(lock_path: Path) -> AsyncIterator[None]:
    """One downloader per version and destination at a time (others wait, without blocking the event loop:
    a patch chain in one process takes the lock of each version it rebuilds while another task may hold it)."""
    with local_disk(f"opening the lock file {lock_path}"):
        handle = open(lock_path, "a")  # noqa: SIM115 - closed below
    with handle:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_local_manifest(
    directory: Path,
    coordinator_id: str,
    version: int | None,
    name: str = LOCAL_MANIFEST_NAME,
    run_name: str | None = None,
) -> SignedManifest | None:
    try:
        return load_verified_manifest((directory / name).read_bytes(), coordinator_id, version, run_name)
    except (OSError, IntegrityError):
        return None


async def fetch_manifest(
    fetcher: ShardFetcher,
    scoreboard: Scoreboard,
    version: int,
    coordinator_id: str,
    emit: EventSink = no_events,
    options: TransferOptions | None = None,
    candidates: Sequence[str] | None = None,
    run_name: str | None = None,
    other_run: set[str] | None = None,
) -> tuple[bytes, SignedManifest]:
    """The version's manifest from the first relay that serves one the coordinator signed (for ``run_name``).

    The best-ranked relay is asked first; if it has not answered after ``hedge_after_s`` (or
    answered with something unusable) the next one is asked too, and so on: the first
    verified manifest wins and the other requests are cancelled. Every request runs under
    the progress deadline, and a relay that was too slow is demoted. A relay serving a well-signed
    manifest of another run (the coordinator's key signs for several) is not banned: it holds another
    run's version under that number, and counts as not holding this one (it is added to ``other_run``).
    """
    options = options or TransferOptions()
    deadline = progress_deadline(options)
    offered = set(scoreboard.sources if candidates is None else candidates)
    queue = [url for url in scoreboard.ranked() if url in offered]
    problems: list[str] = []
    missing = 0
    num_other_run = 0
    running: dict[asyncio.Task[tuple[int, bytes]], tuple[str, float]] = {}

    def ask_next() -> None:
        relay = queue.pop(0)
        url = f"{relay}/v/{version}/manifest.json"
        running[asyncio.create_task(get_bytes(fetcher, url, MAX_MANIFEST_BYTES, deadline))] = (relay, time.monotonic())

    answered_badly = False
    try:
        while queue or running:
            if queue and (answered_badly or not running):
                ask_next()
            answered_badly = False
            timeout = options.hedge_after_s if queue else None
            done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                ask_next()  # the relays asked so far drag: hedge to the next one
                continue
            answered_badly = True  # unless one below is the manifest
            for task in done:
                relay, started = running.pop(task)
                try:
                    status, raw = task.result()
                except TooSlowError as exc:
                    scoreboard.record(relay, "slow", 0, time.monotonic() - started, error=str(exc))
                    problems.append(f"{relay}: too slow")
                    continue
                except (httpx.HTTPError, OSError, TimeoutError) as exc:
                    scoreboard.record(relay, "network", error=str(exc))
                    problems.append(f"{relay}: {type(exc).__name__}" + (f" ({str(exc)[:200]})" if str(exc) else ""))
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
                    signed = load_verified_manifest(raw, coordinator_id, version, run_name)
                except OtherRunError as exc:
                    num_other_run += 1
                    if other_run is not None:
                        other_run.add(relay)
                    emit({"event": "manifest_other_run", "version": version, "source": relay, "reason": exc.message})
                    problems.append(f"{relay}: {exc.message}")
                    continue
                except IntegrityError as exc:
                    scoreboard.record(relay, "integrity", error=exc.message)
                    emit({"event": "manifest_refused", "version": version, "source": relay, "reason": exc.message})
                    problems.append(f"{relay}: {exc.message}")
                    continue
                for other, (other_relay, other_started) in running.items():
                    other.cancel()
                    outcome: Outcome = "slow" if other_started < started else "cancelled"  # outrun by its hedge
                    seconds = time.monotonic() - other_started
                    scoreboard.record(other_relay, outcome, 0, seconds, error=f"outrun by {relay} on the manifest")
                return raw, signed
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    summary = "; ".join(problems) or "no relay left to ask"
    if missing + num_other_run == len(offered):
        of_run = f" of run {run_name!r}" if num_other_run else ""
        raise NotFoundError(f"no relay holds version {version}{of_run} ({summary})")
    if any(scoreboard.is_banned(url) for url in offered):
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
    run_name: str | None = None,
) -> Path:
    """Download ``version`` from ``relays`` into ``dest_root/v{version}`` (see the module docstring).

    With ``run_name`` only manifests of that run are used, and a version held here of another run is not."""
    if not relays:
        raise RemoteUnavailableError("no relay given; pass at least one relay URL")
    options = options or TransferOptions()
    sink = on_event or no_events

    def emit(event: dict[str, Any]) -> None:
        sink({**event, "ts": round(time.time(), 3)})

    with local_disk(f"creating {dest_root}"):
        dest_root.mkdir(parents=True, exist_ok=True)
    final = version_path(dest_root, version)
    started = time.monotonic()
    emit({"event": "start", "version": version, "relays": list(relays), "dest": str(final)})
    async with _exclusive(dest_root / f".lock-v{version}"):
        if _read_local_manifest(final, coordinator_id, version, run_name=run_name) is not None:
            emit({"event": "done", "version": version, "path": str(final), "seconds": 0.0, "bytes": 0, "cached": True})
            return final
        urls = [url.rstrip("/") for url in relays]
        scoreboard = Scoreboard(urls, backoff_base_s=options.backoff_base_s)
        fetcher = open_fetcher(
            urls, transport, options.connect_timeout_s, options.read_timeout_s, 2 * options.num_parallel
        )
        download = _ChainDownload(coordinator_id, dest_root, fetcher, scoreboard, options, emit, run_name)
        try:
            raw, signed = await download.manifest(version)
            remember_newest(dest_root, coordinator_id, raw, version)
            manifest = signed.manifest
            if manifest.kind == "full":
                await download.download_full(version, raw, manifest)
                summary: dict[str, Any] = {"kind": "full", "bytes": manifest.total_size_bytes}
            else:
                summary = await download.rebuild(version)
        finally:
            await fetcher.aclose()
        emit(
            {
                "event": "done",
                "version": version,
                "path": str(final),
                "seconds": round(time.monotonic() - started, 3),
                **summary,
                "cached": False,
                "relays": scoreboard.snapshot(),
            }
        )
        return final


@dataclass(frozen=True)
class _Step:
    """One version of a plan: its verified manifest and the bytes that sign it."""

    version: int
    raw: bytes
    manifest: PolicyManifest


@dataclass
class PatchPlan:
    """How to get a patch version: from a version held here (``start_held``) or from a full one downloaded
    first (``start_full``), then the patches in ``patches``, oldest first."""

    patches: list[_Step]
    start_held: int | None = None
    start_full: _Step | None = None
    refused: set[int] = field(default_factory=set)

    @property
    def download_bytes(self) -> int:
        full = 0 if self.start_full is None else self.start_full.manifest.total_size_bytes
        return full + sum(step.manifest.total_size_bytes for step in self.patches)

    @property
    def base(self) -> int:
        if self.start_full is not None:
            return self.start_full.version
        assert self.start_held is not None
        return self.start_held

    def route(self) -> dict[str, Any]:
        """The plan as the ``plan`` and ``done`` events report it."""
        return {
            "kind": "patch",
            "base": self.base,
            "from": "held" if self.start_held is not None else "full",
            "chain": [step.version for step in self.patches],
            "bytes": self.download_bytes,
            "checkpoint_bytes": self.patches[-1].manifest.result_size_bytes,
        }


class _ChainDownload:
    """One download's relays, scoreboard and options, shared by every version a patch chain needs."""

    def __init__(
        self,
        coordinator_id: str,
        dest_root: Path,
        fetcher: ShardFetcher,
        scoreboard: Scoreboard,
        options: TransferOptions,
        emit: EventSink,
        run_name: str | None = None,
    ) -> None:
        self.coordinator_id = coordinator_id
        self.run_name = run_name
        self.dest_root = dest_root
        self.fetcher = fetcher
        self.scoreboard = scoreboard
        self.options = options
        self.emit = emit
        self._manifests: dict[int, tuple[bytes, SignedManifest]] = {}
        self._other_run: dict[int, set[str]] = {}
        """Per version, the relays that hold another run's version under that number: never asked for its shards."""
        self.verified_here: set[int] = set()
        """Versions this download fetched or rebuilt (and so verified): never suspected of local damage."""

    async def manifest(self, version: int) -> tuple[bytes, SignedManifest]:
        cached = self._manifests.get(version)
        if cached is None:
            cached = await fetch_manifest(
                self.fetcher,
                self.scoreboard,
                version,
                self.coordinator_id,
                self.emit,
                self.options,
                run_name=self.run_name,
                other_run=self._other_run.setdefault(version, set()),
            )
            self._manifests[version] = cached
        return cached

    async def unusable(self, version: int) -> set[str]:
        """The relays not to ask for ``version``'s shards: those that showed another run's manifest of it.

        With a run named, every other relay is asked for the manifest now (at once, for at most
        ``hedge_after_s``): a relay of another run would otherwise serve shards that fail their hashes and be
        banned for a fault that is not its own. One that answers later than that is used, and may be.
        """
        other_run = self._other_run.setdefault(version, set())
        if self.run_name is None or len(self.scoreboard.sources) < 2:
            return other_run
        raw = self._manifests[version][0]
        deadline = progress_deadline(self.options)

        async def probe(relay: str) -> None:
            url = f"{relay}/v/{version}/manifest.json"
            status, body = await get_bytes(self.fetcher, url, MAX_MANIFEST_BYTES, deadline)
            if status != 200 or body == raw:
                return
            try:
                load_verified_manifest(body, self.coordinator_id, version, self.run_name)
            except OtherRunError as exc:
                other_run.add(relay)
                self.emit({"event": "manifest_other_run", "version": version, "source": relay, "reason": exc.message})
            except IntegrityError:
                return  # a forgery: its shards fail their hashes and ban it, as they should

        probes = [asyncio.create_task(probe(url)) for url in self.scoreboard.sources if url not in other_run]
        if probes:
            await asyncio.wait(probes, timeout=self.options.hedge_after_s)
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        return other_run

    def held(self, version: int) -> PolicyManifest | None:
        signed = _read_local_manifest(
            version_path(self.dest_root, version), self.coordinator_id, version, run_name=self.run_name
        )
        return None if signed is None else signed.manifest

    async def download_partial(self, version: int, raw: bytes, manifest: PolicyManifest) -> Path:
        """The files of ``manifest`` (a full version's, or a patch's) downloaded into the version's partial dir."""
        partial = self.dest_root / f"{PARTIAL_PREFIX}{version}"
        unusable = await self.unusable(version)
        await _download_into(
            partial,
            raw,
            manifest,
            self.coordinator_id,
            self.fetcher,
            self.scoreboard,
            self.options,
            self.emit,
            unusable,
        )
        return partial

    async def download_full(self, version: int, raw: bytes, manifest: PolicyManifest) -> None:
        """Download a full version into place (the caller holds its lock)."""
        partial = await self.download_partial(version, raw, manifest)
        _expose(partial, version_path(self.dest_root, version), self.dest_root, version)
        self.verified_here.add(version)

    async def plan(self, version: int) -> PatchPlan:
        """Walk the patch chain down from ``version`` to the first version held here or the first full one.

        Walking down, a held version is always the cheaper start: a full start would download a
        checkpoint plus the very patches the held start needs (no full version lies between them,
        or the walk would have stopped there).
        """
        chain: list[_Step] = []
        current = version
        while True:
            raw, signed = await self.manifest(current)
            step = _Step(current, raw, signed.manifest)
            if step.manifest.kind == "full":
                return PatchPlan(patches=chain[::-1], start_full=step)
            chain.append(step)
            base = step.manifest.base_version
            assert base is not None
            if self.held(base) is not None:
                return PatchPlan(patches=chain[::-1], start_held=base)
            current = base

    async def rebuild(self, version: int) -> dict[str, Any]:
        """Get patch ``version`` by the cheapest plan; on a refused patch, check the base and try once more.

        The caller holds the lock of ``version``. Returns the fields of the ``done`` event.
        """
        for attempt in range(2):
            plan = await self.plan(version)
            route = plan.route()
            self.emit({"event": "plan", "version": version, **route})
            try:
                await self._run(plan, version)
            except _PatchRefusedError as refused:
                self.emit({"event": "patch_refused", **refused.fields()})
                if attempt == 0 and refused.base not in self.verified_here and self._base_damaged(refused.base):
                    continue  # the local base was damaged and is gone now: plan again without it
                raise VersionRefusedError(
                    f"version {version} cannot be rebuilt: the patch of v{refused.version} against "
                    f"v{refused.base} was refused ({refused.reason})"
                ) from None
            return {**route, "bytes_saved": max(0, route["checkpoint_bytes"] - route["bytes"])}
        raise AssertionError("unreachable")

    def _base_damaged(self, base: int) -> bool:
        """Whether the base held here does not hash as signed; a damaged one is removed."""
        manifest = self.held(base)
        directory = version_path(self.dest_root, base)
        if manifest is None:
            return True
        problem = held_version_problem(directory, manifest)
        if problem is None:
            return False
        self.emit({"event": "base_damaged", "version": base, "reason": problem})
        shutil.rmtree(directory, ignore_errors=True)
        return True

    async def _run(self, plan: PatchPlan, top: int) -> None:
        if plan.start_full is not None:
            full = plan.start_full
            async with _exclusive(self.dest_root / f".lock-v{full.version}"):
                if self.held(full.version) is None:
                    await self.download_full(full.version, full.raw, full.manifest)
        for step in plan.patches:
            if step.version == top:  # its lock is the caller's
                await self._apply_step(step)
                continue
            async with _exclusive(self.dest_root / f".lock-v{step.version}"):
                if self.held(step.version) is None:
                    await self._apply_step(step)
                    self.emit({"event": "version_ready", "version": step.version, "kind": "patch"})

    async def _apply_step(self, step: _Step) -> None:
        """Download one patch version's patch, apply it to its base held here, verify the result, expose it."""
        manifest = step.manifest
        base = manifest.base_version
        assert base is not None
        partial = await self.download_partial(step.version, step.raw, manifest)
        built = self.dest_root / f".rebuild-v{step.version}-{uuid.uuid4().hex[:8]}"
        try:
            with local_disk(f"rebuilding v{step.version} under {built}"):
                built.mkdir()
            try:
                await asyncio.to_thread(
                    _apply_and_verify,
                    version_path(self.dest_root, base),
                    partial / manifest.files[0].path,
                    built,
                    manifest,
                )
            except IntegrityError as exc:
                raise _PatchRefusedError(step.version, base, exc.message) from exc
            with local_disk(f"finishing {built}"):
                (built / LOCAL_MANIFEST_NAME).write_bytes(step.raw)
                if self.options.fsync_enabled:
                    await asyncio.to_thread(_fsync_tree, built)
            _expose(built, version_path(self.dest_root, step.version), self.dest_root, step.version)
        finally:
            shutil.rmtree(built, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)
        self.verified_here.add(step.version)


class _PatchRefusedError(Exception):
    """A downloaded patch (its shards verified) did not rebuild the checkpoint its manifest names."""

    def __init__(self, version: int, base: int, reason: str) -> None:
        super().__init__(reason)
        self.version = version
        self.base = base
        self.reason = reason

    def fields(self) -> dict[str, Any]:
        return {"version": self.version, "base": self.base, "reason": self.reason}


def _apply_and_verify(base_dir: Path, patch_file: Path, out_dir: Path, manifest: PolicyManifest) -> None:
    """Apply the patch into ``out_dir``; IntegrityError unless the result hashes as ``result_files`` say."""
    from shardcast.format.patch import apply_patch

    apply_patch(base_dir, patch_file, out_dir, manifest.result_size_bytes)
    problem = result_mismatch(out_dir, manifest)
    if problem is not None:
        raise IntegrityError(f"the rebuilt checkpoint is not the signed one: {problem}")


def held_version_problem(directory: Path, manifest: PolicyManifest) -> str | None:
    """Why a version held at ``directory`` is not what its signed manifest says (None when it is)."""
    if manifest.kind == "patch":
        return result_mismatch(directory, manifest)
    for shard in manifest.shards:
        hasher = new_hasher(manifest.hash_algorithm)
        for span in shard_spans(manifest, shard):
            try:
                with open(directory / span.path, "rb") as handle:
                    handle.seek(span.file_offset)
                    data = handle.read(span.length)
            except OSError as exc:
                return f"{span.path}: {exc}"
            if len(data) != span.length:
                return f"{span.path} is shorter than signed"
            hasher.update(data)
        if hasher.hexdigest() != shard.hash:
            return f"shard {shard.index} does not hash as signed"
    return None


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fsync_file(path)


def _expose(built: Path, final: Path, dest_root: Path, version: int) -> None:
    """Rename a finished, verified version directory into place."""
    with local_disk(f"moving the finished download into {final}"):
        if final.exists():  # left by something else and not a verified version: set it aside
            os.rename(final, dest_root / f".stale-v{version}-{int(time.time())}")
        os.rename(built, final)


def newest_known(dest_root: Path, coordinator_id: str) -> int | None:
    """The newest version held under ``dest_root`` or whose signed manifest a download there verified."""
    known: list[int] = []
    if dest_root.is_dir():
        for path in dest_root.glob("v*"):
            number = path.name[1:]
            if number.isdigit() and _read_local_manifest(path, coordinator_id, int(number)) is not None:
                known.append(int(number))
        seen = _read_local_manifest(dest_root, coordinator_id, None, NEWEST_SEEN_NAME)
        if seen is not None:
            known.append(seen.manifest.version)
    return max(known, default=None)


def remember_newest(dest_root: Path, coordinator_id: str, raw_manifest: bytes, version: int) -> None:
    """Keep ``raw_manifest`` as the newest signed manifest seen under ``dest_root`` if it is newer."""
    seen = _read_local_manifest(dest_root, coordinator_id, None, NEWEST_SEEN_NAME)
    if seen is None or seen.manifest.version < version:
        with local_disk(f"writing {dest_root / NEWEST_SEEN_NAME}"):
            write_file_atomically(dest_root / NEWEST_SEEN_NAME, raw_manifest)


async def _download_into(
    partial: Path,
    raw_manifest: bytes,
    manifest: PolicyManifest,
    coordinator_id: str,
    fetcher: ShardFetcher,
    scoreboard: Scoreboard,
    options: TransferOptions,
    emit: EventSink,
    unusable: set[str] | None = None,
) -> None:
    """Fill ``partial`` with the verified version, resuming what an earlier attempt left there (never asking the
    ``unusable`` relays)."""
    previous = _read_local_manifest(partial, coordinator_id, manifest.version)
    resuming = previous is not None and previous.manifest == manifest
    with local_disk(f"preparing {partial} ({manifest.total_size_bytes} bytes)"):
        if not resuming:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            (partial / LOCAL_MANIFEST_NAME).write_bytes(raw_manifest)
        files = _PreallocatedFiles(partial, manifest, create=not resuming)
    synced = False
    try:
        done = set()
        if resuming:
            with local_disk(f"re-reading the shards already in {partial}"):
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
        sink = _InPlaceSink(files, manifest, partial)
        await fetch_shards(fetcher, manifest, pending, scoreboard, sink, options, emit, unusable or set())
        with local_disk(f"syncing {partial} to disk"):
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
    run_name: str | None = None,
) -> Path:
    """Blocking form of :func:`fetch_version`, for code without an event loop."""
    return asyncio.run(
        fetch_version(version, relays, coordinator_id, dest_root, options, transport, on_event, run_name)
    )


async def latest_version(
    relays: Sequence[str],
    transport: httpx.AsyncBaseTransport | None = None,
    timeout_s: float = 10.0,
    late_grace_s: float = 1.0,
) -> int:
    """The newest version any relay lists (a hint: the download still verifies the manifest).

    A listing is unsigned, so a relay can hide versions: callers never go below
    :func:`newest_known`. Each relay gets ``timeout_s`` in all, and once one has answered the
    rest get ``late_grace_s`` more, so a trickling relay cannot stall the question.
    """

    async def ask(http: httpx.AsyncClient, relay: str) -> int | None:
        try:
            body = await get_bounded(http, f"{relay.rstrip('/')}/versions", MAX_LISTING_BYTES)
            return VersionsResponse.model_validate_json(body).latest
        except (httpx.HTTPError, pydantic.ValidationError):
            return None

    async with httpx.AsyncClient(timeout=timeout_s, transport=transport) as http:
        answers = await prompt_answers([ask(http, relay) for relay in relays], timeout_s, late_grace_s)
    known = [answer for answer in answers if answer is not None]
    if not known:
        raise RemoteUnavailableError(f"no relay answered /versions with a version ({', '.join(relays)})")
    return max(known)


def describe_failure(exc: PrimeError) -> dict[str, Any]:
    """The JSON event for a download that failed."""
    return {"event": "error", "error": exc.code, "detail": exc.message}
