"""The SHARDCAST origin: publish a checkpoint directory as a signed, sharded version, and serve it.

:func:`publish_checkpoint` reads the checkpoint once, writing each shard and hashing it in the
same pass, signs the manifest with the coordinator's key, and renames the finished version
directory into the store: a version is there complete or not at all. It then announces the
new version and prunes old ones, keeping the newest ``keep_versions`` (choose at least
``async_level + 1`` so every version a worker may still use stays downloadable) and never the
announced one. :class:`OriginSource` serves the store through :func:`shardcast.server.create_app`;
the coordinator mounts that app, and ``prime-relay origin`` serves a store on its own.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Literal

from protocol.errors import ConflictError, NotFoundError
from protocol.identity import NodeIdentity
from protocol.schemas import PolicyManifest, ShardEntry, SignedManifest, VersionInfo, VersionsResponse
from shardcast.manifest import (
    DEFAULT_SHARD_SIZE_BYTES,
    HashAlgorithm,
    list_checkpoint_files,
    make_manifest,
    new_hasher,
    parse_signed_manifest,
    plan_files,
    plan_shards,
    sign_manifest,
    spans_of_range,
)
from shardcast.metrics import ShardcastMetrics
from shardcast.store import MANIFEST_NAME, VersionStore, fsync_dir, write_file_atomically

log = logging.getLogger("shardcast.origin")
_COPY_CHUNK_BYTES = 8 * 1024 * 1024


def publish_checkpoint(
    checkpoint_dir: Path,
    version: int,
    identity: NodeIdentity,
    store: VersionStore,
    shard_size_bytes: int = DEFAULT_SHARD_SIZE_BYTES,
    hash_algorithm: HashAlgorithm = "blake3",
    keep_versions: int = 3,
    now: float | None = None,
    fsync_enabled: bool = True,
) -> SignedManifest:
    """Shard, hash, sign and atomically publish ``checkpoint_dir`` as ``version``; then announce and prune.

    With ``fsync_enabled`` (the default) the shards are on disk before the version appears, so a
    crash cannot leave a published version with missing bytes; off, publishing is faster.
    """
    if version in store.versions():
        raise ConflictError(f"version {version} is already published in {store.root}; versions are immutable")
    announced = store.announced()
    if announced is not None and version <= announced:
        raise ConflictError(f"version {version} is not newer than the announced version {announced}")
    files = list_checkpoint_files(checkpoint_dir)
    staged = store.new_staging_dir(f"v{version}")
    try:
        hashes = _write_shards(
            checkpoint_dir, files, staged / "shards", shard_size_bytes, hash_algorithm, fsync_enabled
        )
        manifest = make_manifest(
            version, files, hashes, shard_size_bytes, hash_algorithm, time.time() if now is None else now
        )
        signed = sign_manifest(identity, manifest)
        write_file_atomically(staged / MANIFEST_NAME, signed.model_dump_json().encode())
        fsync_dir(staged)
        store.install_version(staged, version)
    except BaseException:
        store.remove_staging(staged)
        raise
    store.announce(version)
    removed = store.prune(keep_versions, protected={version})
    log.info(
        "published version %d: %d files, %d bytes, %d shards%s",
        version,
        len(files),
        manifest.total_size_bytes,
        len(manifest.shards),
        f"; pruned {removed}" if removed else "",
    )
    return signed


def _write_shards(
    checkpoint_dir: Path,
    files: list[tuple[str, int]],
    shards_dir: Path,
    shard_size_bytes: int,
    hash_algorithm: HashAlgorithm,
    fsync_enabled: bool,
) -> list[str]:
    shards_dir.mkdir()
    entries = plan_files(files)
    total = sum(size for _, size in files)
    hashes: list[str] = []
    buffer = bytearray(_COPY_CHUNK_BYTES)
    for index, (offset, size) in enumerate(plan_shards(total, shard_size_bytes)):
        hasher = new_hasher(hash_algorithm)
        with open(shards_dir / str(index), "wb") as out:
            for span in spans_of_range(entries, offset, size):
                with open(checkpoint_dir / span.path, "rb") as source:
                    source.seek(span.file_offset)
                    left = span.length
                    while left > 0:
                        view = memoryview(buffer)[: min(left, len(buffer))]
                        num_read = source.readinto(view)
                        if not num_read:
                            raise OSError(f"{span.path} shrank while it was being published")
                        hasher.update(view[:num_read])
                        out.write(view[:num_read])
                        left -= num_read
            out.flush()
            if fsync_enabled:
                os.fsync(out.fileno())
        hashes.append(hasher.hexdigest())
    if fsync_enabled:
        fsync_dir(shards_dir)
    return hashes


class OriginSource:
    """Serves a published store (read-only; :func:`publish_checkpoint` may run next to it)."""

    role: Literal["origin", "relay"] = "origin"

    def __init__(self, store: VersionStore, metrics: ShardcastMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics or ShardcastMetrics("origin")
        self._manifests: dict[int, tuple[bytes, PolicyManifest]] = {}

    def _load(self, version: int) -> tuple[bytes, PolicyManifest]:
        if not self.store.version_dir(version).is_dir():
            self._manifests.pop(version, None)
            raise NotFoundError(f"version {version} is not published here (see /versions)")
        cached = self._manifests.get(version)
        if cached is None:
            try:
                raw = self.store.manifest_path(version).read_bytes()
            except FileNotFoundError as exc:
                raise NotFoundError(f"version {version} was just removed; ask for a newer one") from exc
            cached = (raw, parse_signed_manifest(raw).manifest)
            self._manifests[version] = cached
        return cached

    def versions_response(self) -> VersionsResponse:
        infos = []
        for version in self.store.versions():
            try:
                manifest = self._load(version)[1]
            except NotFoundError:
                continue
            infos.append(
                VersionInfo(
                    version=version,
                    num_shards=len(manifest.shards),
                    num_shards_ready=len(manifest.shards),
                    total_size_bytes=manifest.total_size_bytes,
                )
            )
        held = [info.version for info in infos]
        for stale in set(self._manifests) - set(held):
            self._manifests.pop(stale, None)
        announced = self.store.announced()
        latest = announced if announced in held else (max(held) if held else None)
        self.metrics.versions_held.set(len(held))
        self.metrics.latest_version.set(-1 if latest is None else latest)
        return VersionsResponse(role="origin", latest=latest, versions=infos)

    def manifest_bytes(self, version: int) -> bytes:
        return self._load(version)[0]

    async def shard_file(self, version: int, index: int) -> tuple[Path, ShardEntry]:
        manifest = self._load(version)[1]
        if index >= len(manifest.shards):
            raise NotFoundError(f"shard index {index} is out of range: version {version} has {len(manifest.shards)}")
        return self.store.shard_path(version, index), manifest.shards[index]
