"""Sharding math, manifest building, signatures and layout checks (no I/O beyond tmp files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.errors import IntegrityError, ProtocolError
from protocol.identity import NodeIdentity
from protocol.schemas import FileEntry, SignedManifest
from shardcast.format.manifest import (
    check_relative_path,
    hash_bytes,
    list_checkpoint_files,
    load_verified_manifest,
    make_manifest,
    plan_shards,
    sign_manifest,
    spans_of_range,
    verify_signed_manifest,
)

SHARD = 4096


def test_plan_shards_covers_everything_once() -> None:
    assert plan_shards(0, SHARD) == []
    assert plan_shards(SHARD, SHARD) == [(0, SHARD)]
    assert plan_shards(SHARD + 1, SHARD) == [(0, SHARD), (SHARD, 1)]
    layout = plan_shards(10 * SHARD - 7, SHARD)
    assert len(layout) == 10
    assert sum(size for _, size in layout) == 10 * SHARD - 7
    assert all(offset == index * SHARD for index, (offset, _) in enumerate(layout))
    with pytest.raises(ValueError):
        plan_shards(10, 0)


def test_spans_cross_file_boundaries_and_skip_empty_files() -> None:
    files = [
        FileEntry(path="a", offset=0, size_bytes=5),
        FileEntry(path="empty", offset=5, size_bytes=0),
        FileEntry(path="b", offset=5, size_bytes=10),
    ]
    spans = spans_of_range(files, 3, 6)
    assert [(s.path, s.file_offset, s.length, s.range_offset) for s in spans] == [("a", 3, 2, 0), ("b", 0, 4, 2)]
    assert [s.path for s in spans_of_range(files, 5, 10)] == ["b"]


def _manifest(identity: NodeIdentity, version: int = 3) -> SignedManifest:
    data = bytes(range(256)) * 40  # 10240 bytes: two full shards and a partial one
    files = [("config.json", 240), ("model.safetensors", len(data) - 240)]
    hashes = [hash_bytes("blake3", data[offset : offset + size]) for offset, size in plan_shards(len(data), SHARD)]
    manifest = make_manifest(version, files, hashes, SHARD, "blake3", created_at=1.5)
    return sign_manifest(identity, manifest)


def test_signed_manifest_round_trips_and_verifies() -> None:
    coordinator = NodeIdentity.generate()
    signed = _manifest(coordinator)
    raw = signed.model_dump_json().encode()
    again = load_verified_manifest(raw, coordinator.node_id, expected_version=3)
    assert again.manifest == signed.manifest
    assert [s.size_bytes for s in again.manifest.shards] == [SHARD, SHARD, 10240 - 2 * SHARD]


def test_other_signer_tampering_and_wrong_version_are_refused() -> None:
    coordinator, impostor = NodeIdentity.generate(), NodeIdentity.generate()
    forged = _manifest(impostor)
    with pytest.raises(IntegrityError, match="not by the trusted coordinator"):
        verify_signed_manifest(forged, coordinator.node_id)
    # claims the coordinator as signer but the signature is the impostor's
    relabelled = forged.model_copy(update={"signer": coordinator.node_id})
    with pytest.raises(IntegrityError, match="does not verify"):
        verify_signed_manifest(relabelled, coordinator.node_id)
    genuine = _manifest(coordinator)
    shards = list(genuine.manifest.shards)
    shards[1] = shards[1].model_copy(update={"hash": "0" * 64})
    tampered = genuine.model_copy(update={"manifest": genuine.manifest.model_copy(update={"shards": shards})})
    with pytest.raises(IntegrityError, match="does not verify"):
        verify_signed_manifest(tampered, coordinator.node_id)
    with pytest.raises(IntegrityError, match="asked for version 4"):
        verify_signed_manifest(genuine, coordinator.node_id, expected_version=4)
    with pytest.raises(IntegrityError, match="malformed"):
        load_verified_manifest(b'{"manifest": 1}', coordinator.node_id)


def test_a_signed_but_unsafe_layout_is_refused() -> None:
    coordinator = NodeIdentity.generate()
    genuine = _manifest(coordinator).manifest
    files = [genuine.files[0].model_copy(update={"path": "../escape"}), genuine.files[1]]
    evil = sign_manifest(coordinator, genuine.model_copy(update={"files": files}))
    with pytest.raises(IntegrityError, match="not a plain relative path"):
        verify_signed_manifest(evil, coordinator.node_id)
    gap = [genuine.files[0], genuine.files[1].model_copy(update={"offset": 241})]
    with pytest.raises(IntegrityError, match="starts at 241"):
        verify_signed_manifest(
            sign_manifest(coordinator, genuine.model_copy(update={"files": gap})), coordinator.node_id
        )
    short = sign_manifest(coordinator, genuine.model_copy(update={"shards": genuine.shards[:2]}))
    with pytest.raises(IntegrityError, match="layout needs 3"):
        verify_signed_manifest(short, coordinator.node_id)


@pytest.mark.parametrize("path", ["/abs", "a//b", "./a", "a/../b", "a b", "", "x/.shardcast-manifest.json"])
def test_unsafe_paths(path: str) -> None:
    with pytest.raises(ProtocolError):
        check_relative_path(path)


def test_checkpoint_listing_is_sorted_and_refuses_symlinks(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"12")
    (tmp_path / "a.json").write_bytes(b"{}")
    (tmp_path / ".shardcast-manifest.json").write_bytes(b"ignored")
    assert list_checkpoint_files(tmp_path) == [("a.json", 2), ("sub/b.bin", 2)]
    (tmp_path / "link").symlink_to(tmp_path / "a.json")
    with pytest.raises(ProtocolError, match="regular file"):
        list_checkpoint_files(tmp_path)


def test_a_manifest_is_bound_to_its_run() -> None:
    from protocol.errors import OtherRunError
    from shardcast.format.manifest import make_manifest, sign_manifest, verify_signed_manifest

    key = NodeIdentity.generate()
    files, hashes = [("model.bin", 10)], ["a" * 64]
    named = sign_manifest(key, make_manifest(1, files, hashes, 4096, "blake3", 1.0, run_name="run-b"))
    unnamed = sign_manifest(key, make_manifest(1, files, hashes, 4096, "blake3", 1.0))
    assert verify_signed_manifest(named, key.node_id, 1, "run-b").run_name == "run-b"
    with pytest.raises(OtherRunError, match="is of run 'run-b', not of run 'run-a'"):
        verify_signed_manifest(named, key.node_id, 1, "run-a")
    with pytest.raises(OtherRunError, match="names no run"):
        verify_signed_manifest(unnamed, key.node_id, 1, "run-a")
    verify_signed_manifest(named, key.node_id, 1)  # a node that names no run takes any
    # a manifest naming no run signs the bytes it always did: no run_name key at all
    assert "run_name" not in unnamed.manifest.model_dump(mode="json")
