"""The SHARDCAST relay: mirror every version the upstreams announce, verifying all of it, and serve it.

A relay trusts nothing it receives. It polls each upstream's ``/versions`` (an origin or
another relay, so relays chain into a tree), and for each new version it fetches the manifest
and accepts it only if the trusted coordinator signed it (:func:`shardcast.format.manifest.load_verified_manifest`).
It then mirrors the shards with the shared engine (:mod:`shardcast.client.transfer`): from all
upstreams at once, weighted by their measured speed, failing over between them, each shard
hashed as it streams in and made visible only once it matches. Serving is pipelined: a
version is listed as soon as its manifest verifies, each shard is served from the moment it
verifies, and a request for a shard still on its way is held (up to ``shard_wait_s``) until
it lands, then answered 503 with ``Retry-After`` if it has not.

On restart the relay re-verifies what it holds (manifest signatures and shard hashes) and
resumes unfinished versions. It keeps the newest ``keep_versions`` versions, and an older one
as long as it is in use: a download of it (manifest or shard) was served within ``in_use_s``,
so a node fetching a version shard by shard is never cut off halfway. A patch version is
mirrored like any other (its one patch file's shards verified); the relay never applies it,
but it also mirrors and keeps every version a kept patch's chain stands on, down to a full
version, so a client a few versions behind (or holding nothing) can still rebuild it.

A slow upstream costs little (the engine's progress deadlines and hedged requests, for
manifests and shards alike). A local fault (disk full, read-only, permissions) is not
blamed on an upstream: the relay logs it once with what to do, keeps serving what it holds,
and tries mirroring again every ``local_fault_retry_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx
import pydantic

from protocol.errors import IntegrityError, LocalFaultError, NotFoundError, NotReadyError, PrimeError
from protocol.schemas import PolicyManifest, ShardEntry, VersionInfo, VersionsResponse
from shardcast.client.download import fetch_manifest
from shardcast.client.fetchers import get_bounded, open_fetcher
from shardcast.client.progress import prompt_answers
from shardcast.client.scoring import Scoreboard
from shardcast.client.transfer import ShardWriter, TransferOptions, fetch_shards, http_timeout
from shardcast.format.manifest import MAX_LISTING_BYTES, chain_closure, load_verified_manifest, new_hasher
from shardcast.format.store import MANIFEST_NAME, VersionStore, local_disk, pwrite_all, write_file_atomically
from shardcast.http.metrics import ShardcastMetrics
from shardcast.http.server import Segment
from shardcast.relay.config import RelayConfig

log = logging.getLogger("shardcast.relay.mirror")
_POLL_GRACE_S = 1.0
"""How long a poll waits for the other upstreams' listings once one has answered."""
_HASH_CHUNK_BYTES = 8 * 1024 * 1024


class MirroredVersion:
    """A version whose manifest verified; tracks which shards are verified and servable."""

    def __init__(self, raw_manifest: bytes, manifest: PolicyManifest, ready: list[bool]) -> None:
        self.raw_manifest = raw_manifest
        self.manifest = manifest
        self.ready = ready
        self._waiters: dict[int, asyncio.Event] = {}
        self.task: asyncio.Task[None] | None = None

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def num_ready(self) -> int:
        return sum(self.ready)

    @property
    def complete(self) -> bool:
        return all(self.ready)

    def mark_ready(self, index: int) -> None:
        self.ready[index] = True
        waiter = self._waiters.pop(index, None)
        if waiter is not None:
            waiter.set()

    async def wait_ready(self, index: int, timeout_s: float) -> bool:
        if self.ready[index]:
            return True
        waiter = self._waiters.setdefault(index, asyncio.Event())
        try:
            await asyncio.wait_for(waiter.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class _RelayShardWriter:
    """Writes one shard to a staging file; commit renames it into place and wakes waiting requests."""

    def __init__(self, relay: RelayMirror, mirrored: MirroredVersion, shard: ShardEntry) -> None:
        self.relay = relay
        self.mirrored = mirrored
        self.shard = shard
        self.part = relay.store.staging / f"v{mirrored.version}-{shard.index}-{uuid.uuid4().hex[:8]}.part"
        self.fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, offset: int, data: memoryview) -> None:
        pwrite_all(self.fd, data, offset)

    def commit(self) -> None:
        os.close(self.fd)
        target = self.relay.store.shard_path(self.mirrored.version, self.shard.index)
        if not target.parent.is_dir() or self.mirrored.ready[self.shard.index]:  # pruned, or a hedge won first
            self.part.unlink(missing_ok=True)
            return
        os.replace(self.part, target)
        self.mirrored.mark_ready(self.shard.index)
        self.relay.metrics.shards_verified.inc()
        self.relay.metrics.bytes_fetched.inc(self.shard.size_bytes)

    def discard(self) -> None:
        os.close(self.fd)
        self.part.unlink(missing_ok=True)


class _RelaySink:
    def __init__(self, relay: RelayMirror, mirrored: MirroredVersion) -> None:
        self.relay = relay
        self.mirrored = mirrored
        self.location = relay.store.root

    def open_shard(self, shard: ShardEntry) -> ShardWriter:
        return _RelayShardWriter(self.relay, self.mirrored, shard)


def shard_file_matches(path: Path, shard: ShardEntry, algorithm: Literal["blake3", "sha256"]) -> bool:
    """Whether ``path`` holds exactly the shard's signed bytes (used on restart and by clients resuming)."""
    try:
        if path.stat().st_size != shard.size_bytes:
            return False
        hasher = new_hasher(algorithm)
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                hasher.update(chunk)
    except FileNotFoundError:
        return False
    return hasher.hexdigest() == shard.hash


class RelayMirror:
    """The relay's state and its mirroring loop; also the :class:`~shardcast.http.server.ShardSource` it serves."""

    role: Literal["origin", "relay"] = "relay"

    def __init__(
        self,
        config: RelayConfig,
        coordinator_id: str,
        transport: httpx.AsyncBaseTransport | None = None,
        metrics: ShardcastMetrics | None = None,
    ) -> None:
        self.config = config
        self.coordinator_id = coordinator_id
        self.upstreams = [url.rstrip("/") for url in config.upstreams]
        self.store = VersionStore(config.data_dir)
        self.metrics = metrics or ShardcastMetrics("relay")
        self.options = TransferOptions(
            num_parallel=config.num_parallel, min_rate_bps=config.min_rate_bps, hedge_after_s=config.hedge_after_s
        )
        self.scoreboard = Scoreboard(self.upstreams, ban_s=config.upstream_ban_s)
        self.http = httpx.AsyncClient(timeout=http_timeout(self.options), transport=transport)  # control requests
        self.fetcher = open_fetcher(
            self.upstreams,
            transport,
            self.options.connect_timeout_s,
            self.options.read_timeout_s,
            4 * config.num_parallel,
        )
        self.versions: dict[int, MirroredVersion] = {}
        self.last_served: dict[int, float] = {}
        """When (monotonic) each version was last served: recently served versions are in use."""
        self.local_fault: str | None = None
        """The last local fault (disk full, read-only...), while mirroring waits for it to be fixed."""
        self._local_fault_until = 0.0
        self.refusal: str | None = None
        """Why the last manifest offered was refused, until a manifest is accepted again."""
        self.wake = asyncio.Event()
        """Set to poll the upstreams now rather than at the next interval."""

    # --- serving -------------------------------------------------------------------------------

    def versions_response(self) -> VersionsResponse:
        infos = [
            VersionInfo(
                version=mirrored.version,
                num_shards=len(mirrored.ready),
                num_shards_ready=mirrored.num_ready,
                total_size_bytes=mirrored.manifest.total_size_bytes,
            )
            for mirrored in sorted(self.versions.values(), key=lambda m: m.version)
        ]
        latest = max(self.versions) if self.versions else None
        return VersionsResponse(role="relay", latest=latest, versions=infos)

    def health_problems(self) -> list[str]:
        """A refused manifest (a wrong coordinator id, a forger upstream) and a local fault, one line each."""
        problems = []
        if self.refusal is not None:
            problems.append(self.refusal)
        if self.local_fault is not None:
            problems.append(f"mirroring paused by a local fault: {self.local_fault}")
        return problems

    def _held(self, version: int) -> MirroredVersion:
        mirrored = self.versions.get(version)
        if mirrored is None:
            raise NotFoundError(f"version {version} is not held by this relay (see /versions)")
        self.last_served[version] = time.monotonic()
        return mirrored

    def in_use(self) -> set[int]:
        """Versions served within ``in_use_s``: someone may be downloading them shard by shard."""
        since = time.monotonic() - self.config.in_use_s
        return {version for version, served in self.last_served.items() if served >= since}

    def manifest_bytes(self, version: int) -> bytes:
        return self._held(version).raw_manifest

    async def shard_segments(self, version: int, index: int) -> tuple[list[Segment], ShardEntry]:
        mirrored = self._held(version)
        if index >= len(mirrored.ready):
            raise NotFoundError(f"shard index {index} is out of range: version {version} has {len(mirrored.ready)}")
        if not await mirrored.wait_ready(index, self.config.shard_wait_s):
            raise NotReadyError(f"shard {index} of version {version} is still being mirrored; retry shortly")
        shard = mirrored.manifest.shards[index]
        return [Segment(self.store.shard_path(version, index), 0, shard.size_bytes)], shard

    # --- mirroring -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Restore what is on disk, then poll the upstreams forever."""
        await asyncio.to_thread(self.restore)
        for mirrored in self.versions.values():
            self._ensure_mirroring(mirrored)
        while True:
            self.wake.clear()
            try:
                await self.poll_once()
            except Exception:  # a bug must not stop the relay from serving what it has
                log.exception("poll failed")
            with contextlib.suppress(TimeoutError):  # a gossip announcement of a new version wakes it early
                await asyncio.wait_for(self.wake.wait(), timeout=self.config.poll_interval_s)

    def restore(self) -> None:
        """Re-verify versions left on disk by an earlier run; drop whatever does not verify."""
        self.store.clear_leftovers()
        for version in self.store.versions():
            try:
                raw = self.store.manifest_path(version).read_bytes()
                signed = load_verified_manifest(raw, self.coordinator_id, version)
            except (OSError, IntegrityError) as exc:
                log.warning("dropping stored version %d: %s", version, exc)
                self.store.remove_version(version)
                continue
            manifest = signed.manifest
            ready = []
            for shard in manifest.shards:
                path = self.store.shard_path(version, shard.index)
                matches = shard_file_matches(path, shard, manifest.hash_algorithm)
                if not matches:
                    path.unlink(missing_ok=True)
                ready.append(matches)
            self.versions[version] = MirroredVersion(raw, manifest, ready)
            log.info("restored version %d (%d/%d shards verified)", version, sum(ready), len(ready))
        self._update_gauges()

    async def poll_once(self) -> None:
        """Ask every upstream what it holds; adopt new versions, resume stalled ones, prune old ones."""
        listings = await prompt_answers(  # a trickling upstream cannot hold the others' versions back
            [self._list_versions(url) for url in self.upstreams], self.options.response_timeout_s, _POLL_GRACE_S
        )
        offered: dict[int, list[str]] = {}
        for url, listing in zip(self.upstreams, listings, strict=True):
            for info in listing.versions if listing else []:
                offered.setdefault(info.version, []).append(url)
        if offered:
            newest = max(offered)
            for version in sorted(offered):
                if version > newest - self.config.keep_versions and version not in self.versions:
                    await self._adopt(version, offered[version])
            await self._adopt_chain_bases(offered)
        for mirrored in list(self.versions.values()):
            self._ensure_mirroring(mirrored)
        self._prune()

    async def _list_versions(self, url: str) -> VersionsResponse | None:
        try:
            return VersionsResponse.model_validate_json(
                await get_bounded(self.http, f"{url}/versions", MAX_LISTING_BYTES)
            )
        except (httpx.HTTPError, pydantic.ValidationError) as exc:
            log.debug("upstream %s: cannot list versions: %s", url, exc)
            return None

    def _local_fault_pending(self) -> bool:
        return time.monotonic() < self._local_fault_until

    def _on_local_fault(self, exc: LocalFaultError) -> None:
        """Log a local fault once (again only if it changes) and pause mirroring for a while."""
        if exc.message != self.local_fault:
            log.error("mirroring paused, retrying every %g s: %s", self.config.local_fault_retry_s, exc.message)
        self.local_fault = exc.message
        self._local_fault_until = time.monotonic() + self.config.local_fault_retry_s

    async def _adopt(self, version: int, urls: list[str]) -> None:
        """Fetch and verify a manifest from the first upstream that offers a valid one (hedged, deadlined)."""
        if self._local_fault_pending():
            return
        try:
            raw, signed = await fetch_manifest(
                self.fetcher, self.scoreboard, version, self.coordinator_id, self._on_event, self.options, urls
            )
        except PrimeError as exc:
            log.debug("version %d: no upstream served a usable manifest: %s", version, exc.message)
            return
        try:
            with local_disk(f"storing the manifest of version {version} under {self.store.root}"):
                staged = self.store.new_staging_dir(f"v{version}")
                (staged / "shards").mkdir()
                write_file_atomically(staged / MANIFEST_NAME, raw)
                self.store.install_version(staged, version)
        except LocalFaultError as exc:
            self._on_local_fault(exc)
            return
        mirrored = MirroredVersion(raw, signed.manifest, [False] * len(signed.manifest.shards))
        self.versions[version] = mirrored
        self.refusal = None
        log.info("version %d: manifest verified; mirroring %d shards", version, len(mirrored.ready))
        self._ensure_mirroring(mirrored)
        self._update_gauges()

    def _window(self) -> set[int]:
        """The versions kept for their own sake: the newest ``keep_versions`` and those in use."""
        if not self.versions:
            return set()
        newest = max(self.versions)
        in_use = self.in_use()
        return {v for v in self.versions if v > newest - self.config.keep_versions or v in in_use}

    def _chain_bases(self) -> set[int]:
        """Versions the kept patch versions' chains need, down to a full version (a client behind needs them)."""
        return chain_closure({v: m.manifest for v, m in self.versions.items()}, self._window())

    async def _adopt_chain_bases(self, offered: dict[int, list[str]]) -> None:
        """Mirror the bases the kept patches stand on (older than the window), as long as an upstream has them."""
        for _ in range(len(offered)):
            missing = sorted(v for v in self._chain_bases() if v not in self.versions and v in offered)
            if not missing:
                return
            for version in missing:
                await self._adopt(version, offered[version])
            if not any(version in self.versions for version in missing):
                return

    def _ensure_mirroring(self, mirrored: MirroredVersion) -> None:
        if mirrored.complete or (mirrored.task is not None and not mirrored.task.done()):
            return
        if self._local_fault_pending():
            return
        mirrored.task = asyncio.create_task(self._mirror(mirrored))

    async def _mirror(self, mirrored: MirroredVersion) -> None:
        pending = [shard for shard, ready in zip(mirrored.manifest.shards, mirrored.ready, strict=True) if not ready]
        try:
            await fetch_shards(
                self.fetcher,
                mirrored.manifest,
                pending,
                self.scoreboard,
                _RelaySink(self, mirrored),
                self.options,
                self._on_event,
            )
        except LocalFaultError as exc:
            self._on_local_fault(exc)
            return
        except PrimeError as exc:
            log.warning("version %d: mirroring stopped (will retry at the next poll): %s", mirrored.version, exc)
            return
        if self.local_fault is not None:
            log.info("local fault cleared: mirroring again")
            self.local_fault = None
        log.info("version %d: all %d shards verified", mirrored.version, len(mirrored.ready))

    def _on_event(self, event: dict[str, Any]) -> None:
        if event["event"] == "manifest_refused":
            self.refusal = f"refusing manifests: version {event['version']} from {event['source']}: {event['reason']}"
            self.metrics.manifests_rejected.inc()
            log.warning("refused manifest %d from %s: %s", event["version"], event["source"], event["reason"])
        if event["event"] in ("shard_failed", "shard_retry"):
            self.metrics.fetch_failures.labels(kind=event["kind"]).inc()
            if event["kind"] == "integrity":
                log.warning("corrupt shard from upstream: %s", event["reason"])

    def _prune(self) -> None:
        if not self.versions:
            return
        kept = self._window() | self._chain_bases()
        for version in sorted(self.versions):
            if version in kept:
                continue
            mirrored = self.versions.pop(version)
            self.last_served.pop(version, None)
            if mirrored.task is not None:
                mirrored.task.cancel()
            self.store.remove_version(version)
            log.info("pruned version %d", version)
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.versions_held.set(len(self.versions))
        self.metrics.latest_version.set(max(self.versions) if self.versions else -1)

    async def aclose(self) -> None:
        for mirrored in self.versions.values():
            if mirrored.task is not None:
                mirrored.task.cancel()
        await self.fetcher.aclose()
        await self.http.aclose()
