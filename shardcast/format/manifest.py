"""Manifests: how a checkpoint becomes shards, and the checks every relay and client runs on one.

A policy version is the checkpoint directory's regular files, sorted by their POSIX relative
path and concatenated; that byte stream is cut into shards of ``shard_size_bytes`` (the last
one shorter), each hashed with blake3 or sha256. The coordinator signs the resulting
:class:`~protocol.schemas.PolicyManifest` (:func:`sign_manifest`); anyone holding its node id
checks the signature *and* the layout (:func:`verify_signed_manifest`) before trusting a byte,
because a well-signed manifest could still be malformed by a bug and a relay must never be
able to steer a client into writing outside its output directory.

A *patch* version (``kind="patch"``) carries one file, a value patch against ``base_version``
in ``encoding`` (:mod:`shardcast.format.patch`), and lists the checkpoint it rebuilds as
``result_files`` with each file's hash, so a client checks the rebuilt checkpoint bit for bit
(:func:`result_mismatch`), not only the patch it downloaded.

Everything here is pure except the functions that stat or hash files (:func:`list_checkpoint_files`,
:func:`hash_file`, :func:`result_files_of`, :func:`result_mismatch`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, Protocol

import blake3
import pydantic

from protocol.errors import BadSignatureError, IntegrityError, OtherRunError, ProtocolError
from protocol.identity import NodeIdentity
from protocol.schemas import PATCH_ENCODING, FileEntry, PolicyManifest, ResultFileEntry, ShardEntry, SignedManifest
from protocol.signing import sign_document, verify_document

HashAlgorithm = Literal["blake3", "sha256"]
MIB = 1024 * 1024
DEFAULT_SHARD_SIZE_BYTES = 32 * MIB
MIN_SHARD_SIZE_BYTES = 4096
MAX_SHARD_SIZE_BYTES = 1024 * MIB
MAX_MANIFEST_BYTES = 16 * MIB
"""Largest signed manifest a node reads (checked while it streams in, before it is parsed): about 130,000
shards, 4 TiB at the default shard size. The origin refuses to publish a larger one."""
MAX_LISTING_BYTES = 1 * MIB
"""Largest ``/versions`` listing a node reads from a relay or upstream (it names the few versions kept)."""
# Files a download leaves next to the checkpoint; never part of a published version.
LOCAL_MANIFEST_NAME = ".shardcast-manifest.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PATH_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new_hasher(algorithm: HashAlgorithm) -> Hasher:
    """A streaming hasher for ``algorithm`` (both give 64 hex digits)."""
    if algorithm == "blake3":
        hasher: Hasher = blake3.blake3()
        return hasher
    return hashlib.sha256()


def hash_bytes(algorithm: HashAlgorithm, data: bytes) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def hash_file(algorithm: HashAlgorithm, path: Path, chunk_bytes: int = 8 * MIB) -> str:
    """The hash of a whole file: blake3 over a memory map on every core, sha256 read in chunks."""
    if algorithm == "blake3":
        mapped = blake3.blake3(max_threads=blake3.blake3.AUTO)
        if path.stat().st_size:
            mapped.update_mmap(str(path))
        return str(mapped.hexdigest())
    hasher = new_hasher(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            hasher.update(chunk)
    return hasher.hexdigest()


def result_files_of(directory: Path, algorithm: HashAlgorithm) -> list[ResultFileEntry]:
    """The :class:`ResultFileEntry` of every checkpoint file under ``directory`` (what a patch must rebuild)."""
    return [
        ResultFileEntry(path=path, size_bytes=size, hash=hash_file(algorithm, directory / path))
        for path, size in list_checkpoint_files(directory)
    ]


def checkpoint_digest(directory: Path) -> str:
    """One blake3 over a checkpoint directory's files (each path, size and blake3): what pins a LoRA run's base."""
    listing = [(entry.path, entry.size_bytes, entry.hash) for entry in result_files_of(directory, "blake3")]
    return hash_bytes("blake3", json.dumps(listing).encode())


def file_list_mismatch(found: Sequence[tuple[str, int]], expected: Sequence[tuple[str, int]]) -> str | None:
    """How two (path, size) listings differ: which paths, or only sizes (None when they are equal)."""
    if list(found) == list(expected):
        return None
    names = sorted({path for path, _ in found} ^ {path for path, _ in expected})
    return f"files differ ({', '.join(names[:3])})" if names else "file sizes differ"


def result_mismatch(directory: Path, manifest: PolicyManifest) -> str | None:
    """Why ``directory`` is not exactly the checkpoint a patch manifest's ``result_files`` name (None if it is)."""
    try:
        found = list_checkpoint_files(directory)
    except ProtocolError as exc:
        return exc.message
    listing = file_list_mismatch(found, [(entry.path, entry.size_bytes) for entry in manifest.result_files])
    if listing is not None:
        return listing
    for entry in manifest.result_files:
        digest = hash_file(manifest.hash_algorithm, directory / entry.path)
        if digest != entry.hash:
            return f"{entry.path} hashes to {digest[:16]}..., the manifest says {entry.hash[:16]}..."
    return None


@dataclass(frozen=True)
class FileSpan:
    """The part of one file that a byte range of the concatenated version covers."""

    path: str
    file_offset: int
    length: int
    range_offset: int
    """Where this span starts, relative to the start of the byte range asked for."""


def check_relative_path(path: str) -> None:
    """Refuse a path that could escape the output directory or clash with our own files."""
    pure = PurePosixPath(path)
    parts = path.split("/")
    if pure.is_absolute() or not path or any(part in ("", ".", "..") for part in parts):
        raise ProtocolError(f"file path {path!r} is not a plain relative path")
    if not all(_PATH_PART.match(part) for part in parts):
        raise ProtocolError(f"file path {path!r} has characters outside [A-Za-z0-9_.-/]")
    if parts[-1] == LOCAL_MANIFEST_NAME:
        raise ProtocolError(f"file path {path!r} is reserved for the local manifest copy")


def list_checkpoint_files(directory: Path) -> list[tuple[str, int]]:
    """(relative POSIX path, size) of every regular file under ``directory``, in version order."""
    if not directory.is_dir():
        raise ProtocolError(f"checkpoint {directory} is not a directory")
    found: list[tuple[str, int]] = []
    for path in directory.rglob("*"):
        if path.name == LOCAL_MANIFEST_NAME or path.is_dir():
            continue
        if path.is_symlink() or not path.is_file():
            raise ProtocolError(f"{path} is not a regular file; a checkpoint holds regular files only")
        relative = path.relative_to(directory).as_posix()
        check_relative_path(relative)
        found.append((relative, path.stat().st_size))
    if not found:
        raise ProtocolError(f"checkpoint {directory} holds no files")
    return sorted(found)


def plan_files(files: Sequence[tuple[str, int]]) -> list[FileEntry]:
    """Place files back to back in the given order."""
    entries: list[FileEntry] = []
    offset = 0
    for path, size in files:
        entries.append(FileEntry(path=path, offset=offset, size_bytes=size))
        offset += size
    return entries


def plan_shards(total_size_bytes: int, shard_size_bytes: int) -> list[tuple[int, int]]:
    """(offset, size) of each shard; every shard is full except possibly the last."""
    if shard_size_bytes <= 0:
        raise ValueError("shard_size_bytes must be positive")
    return [
        (offset, min(shard_size_bytes, total_size_bytes - offset))
        for offset in range(0, total_size_bytes, shard_size_bytes)
    ]


def spans_of_range(files: Sequence[FileEntry], offset: int, size: int) -> list[FileSpan]:
    """Which parts of which files the range [offset, offset + size) of the version covers."""
    spans: list[FileSpan] = []
    end = offset + size
    for entry in files:
        file_end = entry.offset + entry.size_bytes
        if entry.size_bytes == 0 or file_end <= offset or entry.offset >= end:
            continue
        start = max(offset, entry.offset)
        stop = min(end, file_end)
        spans.append(FileSpan(entry.path, start - entry.offset, stop - start, start - offset))
    return spans


def shard_spans(manifest: PolicyManifest, shard: ShardEntry) -> list[FileSpan]:
    return spans_of_range(manifest.files, shard.offset, shard.size_bytes)


@dataclass(frozen=True)
class PatchOf:
    """What makes a manifest a patch version's: its base, encoding and the checkpoint it reconstructs."""

    base_version: int
    encoding: str
    result_files: Sequence[ResultFileEntry]


def make_manifest(
    version: int,
    files: Sequence[tuple[str, int]],
    shard_hashes: Sequence[str],
    shard_size_bytes: int,
    hash_algorithm: HashAlgorithm,
    created_at: float,
    patch: PatchOf | None = None,
    run_name: str | None = None,
    served_on: int | None = None,
) -> PolicyManifest:
    """Assemble (and check) the manifest of a version whose shards hash to ``shard_hashes``.

    With ``patch`` the version is a patch: ``files`` is the patch file, ``patch`` says what it rebuilds.
    ``run_name`` binds the version to its run (see :func:`verify_signed_manifest`); ``served_on`` names the
    base model version a LoRA adapter version is loaded on.
    """
    entries = plan_files(files)
    total = sum(size for _, size in files)
    layout = plan_shards(total, shard_size_bytes)
    if len(layout) != len(shard_hashes):
        raise ValueError(f"{len(shard_hashes)} hashes for {len(layout)} shards")
    shards = [
        ShardEntry(index=index, offset=offset, size_bytes=size, hash=digest)
        for index, ((offset, size), digest) in enumerate(zip(layout, shard_hashes, strict=True))
    ]
    manifest = PolicyManifest(
        version=version,
        created_at=created_at,
        hash_algorithm=hash_algorithm,
        shard_size_bytes=shard_size_bytes,
        total_size_bytes=total,
        files=entries,
        shards=shards,
        run_name=run_name,
        served_on=served_on,
        **(
            {}
            if patch is None
            else {
                "kind": "patch",
                "base_version": patch.base_version,
                "encoding": patch.encoding,
                "result_files": list(patch.result_files),
            }
        ),
    )
    check_manifest_layout(manifest)
    return manifest


def check_manifest_layout(manifest: PolicyManifest) -> None:
    """ProtocolError unless files and shards tile the version exactly and every path is safe."""
    if not MIN_SHARD_SIZE_BYTES <= manifest.shard_size_bytes <= MAX_SHARD_SIZE_BYTES:
        raise ProtocolError(
            f"shard size {manifest.shard_size_bytes} outside [{MIN_SHARD_SIZE_BYTES}, {MAX_SHARD_SIZE_BYTES}]"
        )
    offset = 0
    seen: set[str] = set()
    for entry in manifest.files:
        check_relative_path(entry.path)
        if entry.offset != offset:
            raise ProtocolError(f"file {entry.path} starts at {entry.offset}, expected {offset}")
        if entry.path in seen:
            raise ProtocolError(f"file {entry.path} is listed twice")
        seen.add(entry.path)
        offset += entry.size_bytes
    for path in seen:
        parents = PurePosixPath(path).parents
        clash = next((str(parent) for parent in parents if str(parent) in seen), None)
        if clash is not None:
            raise ProtocolError(f"file {path} lies under {clash}, which is a file too")
    if offset != manifest.total_size_bytes:
        raise ProtocolError(f"files add up to {offset} bytes, manifest says {manifest.total_size_bytes}")
    expected = plan_shards(manifest.total_size_bytes, manifest.shard_size_bytes)
    if len(expected) != len(manifest.shards):
        raise ProtocolError(f"{len(manifest.shards)} shards listed, the layout needs {len(expected)}")
    for position, (shard, (offset, size)) in enumerate(zip(manifest.shards, expected, strict=True)):
        if (shard.index, shard.offset, shard.size_bytes) != (position, offset, size):
            raise ProtocolError(
                f"shard {position} is (index {shard.index}, offset {shard.offset}, size {shard.size_bytes}), "
                f"expected (index {position}, offset {offset}, size {size})"
            )
        if not _HEX64.match(shard.hash):
            raise ProtocolError(f"shard {position} hash is not 64 lowercase hex digits")
    if manifest.kind == "patch":
        check_patch_layout(manifest)


def check_patch_layout(manifest: PolicyManifest) -> None:
    """ProtocolError unless a patch version's one patch file and its result files are well formed."""
    if manifest.encoding != PATCH_ENCODING:
        raise ProtocolError(f"patch encoding {manifest.encoding!r} is not {PATCH_ENCODING!r}, the one this node reads")
    if len(manifest.files) != 1:
        raise ProtocolError(f"a patch version holds exactly one file (the patch), not {len(manifest.files)}")
    paths = [entry.path for entry in manifest.result_files]
    if paths != sorted(set(paths)):
        raise ProtocolError("result files are not sorted by path, or one is listed twice")
    seen = set(paths)
    for entry in manifest.result_files:
        check_relative_path(entry.path)
        clash = next((str(p) for p in PurePosixPath(entry.path).parents if str(p) in seen), None)
        if clash is not None:
            raise ProtocolError(f"result file {entry.path} lies under {clash}, which is a file too")
        if not _HEX64.match(entry.hash):
            raise ProtocolError(f"result file {entry.path} hash is not 64 lowercase hex digits")


def chain_closure(manifests: Mapping[int, PolicyManifest], keep: Iterable[int]) -> set[int]:
    """The versions the ``keep`` versions stand on: each patch's base, its base's base... down to a full one, and
    the base model a LoRA adapter version is served on (``served_on``).

    A version missing from ``manifests`` ends its chain (nothing more is known below it).
    """
    needed: set[int] = set()
    for version in keep:
        manifest = manifests.get(version)
        if manifest is not None and manifest.served_on is not None:
            needed.add(manifest.served_on)
        while manifest is not None and manifest.kind == "patch" and manifest.base_version is not None:
            base = manifest.base_version
            if base in needed:
                break
            needed.add(base)
            manifest = manifests.get(base)
    return needed


def sign_manifest(identity: NodeIdentity, manifest: PolicyManifest) -> SignedManifest:
    signature = sign_document(identity, manifest.model_dump(mode="json"))
    return SignedManifest(manifest=manifest, signer=identity.node_id, signature_b64=signature)


def parse_signed_manifest(raw: bytes) -> SignedManifest:
    """Decode a manifest document; IntegrityError when it is not one."""
    try:
        return SignedManifest.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]["msg"]
        raise IntegrityError(f"manifest is malformed: {exc.error_count()} problem(s), first: {first}") from exc


def verify_signed_manifest(
    signed: SignedManifest, coordinator_id: str, expected_version: int | None = None, run_name: str | None = None
) -> PolicyManifest:
    """The manifest, once its signer, signature, version, run and layout are all right; else IntegrityError.

    With ``run_name`` (the node's run, from the coordinator's signed run spec) a manifest of another run, or
    of none, raises :class:`~protocol.errors.OtherRunError`: well signed, so not the sender's forgery, but
    not this run's version either.
    """
    if signed.signer != coordinator_id:
        raise IntegrityError(f"manifest is signed by {signed.signer}, not by the trusted coordinator {coordinator_id}")
    try:
        verify_document(coordinator_id, signed.manifest.model_dump(mode="json"), signed.signature_b64)
    except BadSignatureError as exc:
        raise IntegrityError(f"manifest signature does not verify: {exc.message}") from exc
    manifest = signed.manifest
    if expected_version is not None and manifest.version != expected_version:
        raise IntegrityError(f"asked for version {expected_version}, got a manifest for version {manifest.version}")
    if run_name is not None and manifest.run_name != run_name:
        theirs = "names no run" if manifest.run_name is None else f"is of run {manifest.run_name!r}"
        raise OtherRunError(f"the manifest of version {manifest.version} {theirs}, not of run {run_name!r}")
    try:
        check_manifest_layout(manifest)
    except ProtocolError as exc:
        raise IntegrityError(f"signed manifest has an invalid layout: {exc.message}") from exc
    return manifest


def load_verified_manifest(
    raw: bytes, coordinator_id: str, expected_version: int | None = None, run_name: str | None = None
) -> SignedManifest:
    """Parse and verify in one step; returns the signed document (whose bytes can be served on)."""
    signed = parse_signed_manifest(raw)
    verify_signed_manifest(signed, coordinator_id, expected_version, run_name)
    return signed
