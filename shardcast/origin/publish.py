"""The SHARDCAST origin: publish a checkpoint directory as a signed, sharded version, and serve it.

:func:`publish_checkpoint` places the checkpoint's files in the store (hard links, so no copy,
when the filesystem allows), hashes each shard of their concatenation, signs the manifest with
the coordinator's key, and renames the finished version directory into the store: a version is
there complete or not at all. A shard is served straight from the parts of the files it
covers (:class:`~shardcast.http.server.Segment`), so the origin keeps no second copy of the bytes. It then announces the
new version and, given ``keep_versions``, prunes old ones, keeping the newest ``keep_versions`` (choose at
least ``async_level + 1`` so every version a worker may still use stays downloadable) and never the
announced one; the coordinator passes none and prunes its store itself, with its own retention policy
(:func:`coordinator.loop.policies.prune_origin`). :class:`OriginSource` serves the store through
:func:`shardcast.http.server.create_app`; the coordinator mounts that app, and ``prime-relay origin``
serves a store on its own.

With a :class:`PatchPolicy` the origin may publish a version as a *value patch* against the
version announced before it (:func:`choose_patch`): when that version is still in the store,
the new version is not a multiple of ``full_every``, and the patch saves at least
``min_saving_fraction`` (10%) of the checkpoint's bytes. A patch version's store directory
holds the patch under ``files/`` (what is served) and the checkpoint it rebuilds under
``result/`` (hard links; the base of the next patch).
Pruning never breaks a chain: every kept patch keeps the versions down to its full base
(:func:`shardcast.format.manifest.chain_closure`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from protocol.errors import ConflictError, NotFoundError, ProtocolError
from protocol.identity import NodeIdentity
from protocol.schemas import PATCH_ENCODING, PolicyManifest, ShardEntry, SignedManifest, VersionInfo, VersionsResponse
from shardcast.format.manifest import (
    DEFAULT_SHARD_SIZE_BYTES,
    MAX_MANIFEST_BYTES,
    HashAlgorithm,
    PatchOf,
    chain_closure,
    file_list_mismatch,
    list_checkpoint_files,
    make_manifest,
    new_hasher,
    parse_signed_manifest,
    plan_files,
    plan_shards,
    result_files_of,
    result_mismatch,
    shard_spans,
    sign_manifest,
    spans_of_range,
)
from shardcast.format.store import MANIFEST_NAME, VersionStore, fsync_dir, fsync_file, write_file_atomically
from shardcast.http.metrics import ShardcastMetrics
from shardcast.http.server import Segment

log = logging.getLogger("shardcast.origin.publish")
_READ_CHUNK_BYTES = 8 * 1024 * 1024
FILES_DIR = "files"
RESULT_DIR = "result"
"""A patch version's rebuilt checkpoint in the origin store (never served; the next patch's base)."""
PATCH_FILE_NAME = "value.patch"


@dataclass(frozen=True)
class PatchPolicy:
    """When the origin publishes a version as a value patch instead of a full checkpoint."""

    enabled: bool = True
    full_every: int = 10
    """Versions that are a multiple of this are always full (a bound on chain length)."""
    level: int = 3
    """zstd level of the patch."""
    min_saving_fraction: float = 0.1
    """A patch is published only when it is at least this fraction smaller than the checkpoint: a node
    without the base pays the full version plus every patch after it, and each patch costs a rebuild."""


@dataclass(frozen=True)
class PatchChoice:
    """A patch the origin decided to publish: against which base, and how large."""

    base_version: int
    patch_path: Path
    patch_bytes: int
    full_bytes: int


def checkpoint_dir_of(store: VersionStore, version: int) -> Path:
    """Where the checkpoint of a stored version lies: ``files/`` for a full version, ``result/`` for a patch."""
    result = store.version_dir(version) / RESULT_DIR
    return result if result.is_dir() else store.version_dir(version) / FILES_DIR


def choose_patch(
    store: VersionStore, version: int, new_dir: Path, work_dir: Path, policy: PatchPolicy | None
) -> PatchChoice | None:
    """The patch to publish ``version`` (checkpoint ``new_dir``) as, or None for a full version.

    A patch is made against the announced version when it is still in the store and older, unless
    ``version`` is a multiple of ``full_every``; it is kept only when it saves at least ``min_saving_fraction``
    of the checkpoint's bytes.
    A codec failure is no reason to stop publishing: it is logged and the version goes out full.
    """
    if policy is None or not policy.enabled or version % policy.full_every == 0:
        return None
    base = store.announced()
    if base is None or base >= version or base not in store.versions():
        return None
    base_files = {path for path, _ in list_checkpoint_files(checkpoint_dir_of(store, base))}
    if base_files != {path for path, _ in list_checkpoint_files(new_dir)}:
        return None  # other files (a LoRA run's first adapter after its base): nothing to patch against
    from shardcast.format.patch import encode_patch

    work_dir.mkdir(parents=True, exist_ok=True)
    patch_path = work_dir / PATCH_FILE_NAME
    try:
        stats = encode_patch(checkpoint_dir_of(store, base), new_dir, patch_path, level=policy.level)
    except Exception as exc:  # a codec that cannot patch these files: publish the checkpoint
        log.warning(
            "version %d: no patch against v%d (%s: %s); publishing it full", version, base, type(exc).__name__, exc
        )
        return None
    patch_bytes = patch_path.stat().st_size
    full_bytes = sum(size for _, size in list_checkpoint_files(new_dir))
    if patch_bytes > full_bytes * (1.0 - policy.min_saving_fraction):
        log.info(
            "version %d: a patch against v%d is %d bytes, not %.0f%% smaller than %d; publishing it full",
            version,
            base,
            patch_bytes,
            100 * policy.min_saving_fraction,
            full_bytes,
        )
        return None
    log.info(
        "version %d: patch against v%d, %d of %d bytes (%d of %d elements changed)",
        version,
        base,
        patch_bytes,
        full_bytes,
        stats.num_changed,
        stats.num_elements,
    )
    return PatchChoice(base, patch_path, patch_bytes, full_bytes)


def publish_checkpoint(
    checkpoint_dir: Path,
    version: int,
    identity: NodeIdentity,
    store: VersionStore,
    shard_size_bytes: int = DEFAULT_SHARD_SIZE_BYTES,
    hash_algorithm: HashAlgorithm = "blake3",
    keep_versions: int | None = 3,
    now: float | None = None,
    fsync_enabled: bool = True,
    link_enabled: bool = True,
    patches: PatchPolicy | None = None,
    run_name: str | None = None,
    served_on: int | None = None,
) -> SignedManifest:
    """Hash, sign and atomically publish ``checkpoint_dir`` as ``version``; then announce and prune.

    ``run_name`` is signed into the manifest: nodes of that run refuse other runs' versions (a coordinator key
    that signs for several runs must give each its own run name). ``served_on``: the version is a LoRA adapter
    loaded on that version's base model, which is kept (here and on relays) as long as this one is.

    ``keep_versions`` None leaves pruning to the caller (the coordinator has its own retention policy).
    ``patches`` None publishes a full version; else :func:`choose_patch` decides.

    The files enter the store as hard links when ``link_enabled`` and the store is on the same
    filesystem (no copy at all), else as copies. A hard link shares the checkpoint's bytes, so a
    published checkpoint must never be rewritten in place (write each version to a new
    directory, as the trainer does); if that cannot be promised, pass ``link_enabled=False``.
    The hashes are taken from the files as placed in the store, so they describe what is served.
    With ``fsync_enabled`` (the default) the files are on disk before the version appears.
    """
    with store.publishing():
        if version in store.versions():
            raise ConflictError(f"version {version} is already published in {store.root}; versions are immutable")
        announced = store.announced()
        if announced is not None and version <= announced:
            raise ConflictError(f"version {version} is not newer than the announced version {announced}")
        files = list_checkpoint_files(checkpoint_dir)
        staged = store.new_staging_dir(f"v{version}")
        try:
            _place_files(checkpoint_dir, files, staged / RESULT_DIR, link_enabled, fsync_enabled)
            choice = choose_patch(store, version, staged / RESULT_DIR, staged / "work", patches)
            patch: PatchOf | None = None
            if choice is None:
                os.rename(staged / RESULT_DIR, staged / FILES_DIR)
                served = files
            else:
                (staged / FILES_DIR).mkdir()
                os.rename(choice.patch_path, staged / FILES_DIR / PATCH_FILE_NAME)
                shutil.rmtree(staged / "work", ignore_errors=True)
                served = [(PATCH_FILE_NAME, choice.patch_bytes)]
                if fsync_enabled:
                    fsync_file(staged / FILES_DIR / PATCH_FILE_NAME)
                    fsync_dir(staged / FILES_DIR)
                result = result_files_of(staged / RESULT_DIR, hash_algorithm)
                patch = PatchOf(choice.base_version, PATCH_ENCODING, result)
            hashes = _hash_shards(staged / FILES_DIR, served, shard_size_bytes, hash_algorithm)
            created = time.time() if now is None else now
            manifest = make_manifest(
                version,
                served,
                hashes,
                shard_size_bytes,
                hash_algorithm,
                created,
                patch,
                run_name=run_name,
                served_on=served_on,
            )
            signed = sign_manifest(identity, manifest)
            document = signed.model_dump_json().encode()
            if len(document) > MAX_MANIFEST_BYTES:  # no node would read it
                raise ProtocolError(
                    f"the manifest of version {version} would be {len(document)} bytes, over the {MAX_MANIFEST_BYTES} "
                    f"nodes read ({len(manifest.shards)} shards); publish it with a larger shard_size_bytes"
                )
            write_file_atomically(staged / MANIFEST_NAME, document)
            fsync_dir(staged)
            store.install_version(staged, version)
        except BaseException:
            store.remove_staging(staged)
            raise
        store.announce(version)
        removed = [] if keep_versions is None else prune_store(store, keep_versions, protected={version})
    log.info(
        "published version %d (%s): %d files, %d bytes, %d shards%s",
        version,
        "full" if manifest.kind == "full" else f"patch against v{manifest.base_version}",
        len(files),
        manifest.total_size_bytes,
        len(manifest.shards),
        f"; pruned {removed}" if removed else "",
    )
    return signed


def stored_manifests(store: VersionStore) -> dict[int, PolicyManifest]:
    """The manifest of every version in the store (unverified: the store is the origin's own)."""
    found: dict[int, PolicyManifest] = {}
    for version in store.versions():
        try:
            found[version] = parse_signed_manifest(store.manifest_path(version).read_bytes()).manifest
        except (OSError, ProtocolError):
            continue
    return found


def chain_bases(store: VersionStore, keep: Iterable[int]) -> set[int]:
    """The versions the ``keep`` versions' patch chains need (down to each chain's full version)."""
    return chain_closure(stored_manifests(store), keep)


def prune_store(store: VersionStore, keep_versions: int, protected: Iterable[int] = ()) -> list[int]:
    """Keep the newest ``keep_versions`` and ``protected`` versions, and every version their chains need."""
    held = store.versions()
    kept = set(sorted(held, reverse=True)[:keep_versions]) | set(protected)
    return store.prune(keep_versions, protected=set(protected) | chain_bases(store, kept))


def stored_version_differs(store: VersionStore, version: int, checkpoint_dir: Path) -> str | None:
    """Why the stored ``version`` is not ``checkpoint_dir``'s content (None when it is, byte for byte).

    Used to finish an interrupted publication safely: the version in the store may be from
    another checkpoint (a publish killed before the ledger made it current).
    """
    manifest = parse_signed_manifest(store.manifest_path(version).read_bytes()).manifest
    if manifest.kind == "patch":
        return result_mismatch(checkpoint_dir, manifest)
    files = list_checkpoint_files(checkpoint_dir)
    stored = [(entry.path, entry.size_bytes) for entry in manifest.files]
    listing = file_list_mismatch(files, stored)
    if listing is not None:
        return f"{listing}: {len(stored)} files, {manifest.total_size_bytes} bytes stored"
    hashes = _hash_shards(checkpoint_dir, files, manifest.shard_size_bytes, manifest.hash_algorithm)
    differing = [shard.index for shard, digest in zip(manifest.shards, hashes, strict=True) if shard.hash != digest]
    if differing:
        return f"{len(differing)} of {len(hashes)} shards hash differently (first: shard {differing[0]})"
    return None


def _place_files(
    checkpoint_dir: Path, files: list[tuple[str, int]], files_dir: Path, link_enabled: bool, fsync_enabled: bool
) -> None:
    for relative, size in files:
        source, target = checkpoint_dir / relative, files_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not link_enabled:
                raise OSError("linking disabled")
            os.link(source, target)
        except OSError:  # another filesystem, or links not wanted: copy (in the kernel where possible)
            shutil.copyfile(source, target)
        if target.stat().st_size != size:
            raise ProtocolError(f"{source} changed size while it was being published")
        if fsync_enabled:
            fsync_file(target)
    if fsync_enabled:
        for directory in {(files_dir / relative).parent for relative, _ in files}:
            fsync_dir(directory)


def _hash_shards(
    files_dir: Path, files: list[tuple[str, int]], shard_size_bytes: int, algorithm: HashAlgorithm
) -> list[str]:
    entries = plan_files(files)
    hashes: list[str] = []
    buffer = bytearray(_READ_CHUNK_BYTES)
    for offset, size in plan_shards(sum(size for _, size in files), shard_size_bytes):
        hasher = new_hasher(algorithm)
        for span in spans_of_range(entries, offset, size):
            with open(files_dir / span.path, "rb") as source:
                source.seek(span.file_offset)
                left = span.length
                while left > 0:
                    view = memoryview(buffer)[: min(left, len(buffer))]
                    num_read = source.readinto(view)
                    if not num_read:
                        raise ProtocolError(f"{span.path} shrank while it was being published")
                    hasher.update(view[:num_read])
                    left -= num_read
        hashes.append(hasher.hexdigest())
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

    def health_problems(self) -> list[str]:
        return []  # the origin serves what was published; a publish fault is the publisher's error

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
        self.metrics.observe_versions(self._manifests[version][1] for version in held if version in self._manifests)
        return VersionsResponse(role="origin", latest=latest, versions=infos)

    def manifest_bytes(self, version: int) -> bytes:
        return self._load(version)[0]

    def files_dir(self, version: int) -> Path:
        return self.store.version_dir(version) / FILES_DIR

    async def shard_segments(self, version: int, index: int) -> tuple[list[Segment], ShardEntry]:
        manifest = self._load(version)[1]
        if index >= len(manifest.shards):
            raise NotFoundError(f"shard index {index} is out of range: version {version} has {len(manifest.shards)}")
        shard = manifest.shards[index]
        files_dir = self.files_dir(version)
        segments = [Segment(files_dir / s.path, s.file_offset, s.length) for s in shard_spans(manifest, shard)]
        return segments, shard
