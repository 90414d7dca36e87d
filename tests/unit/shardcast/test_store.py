"""Publishing: atomic version directories, retention that spares the announced version."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol.errors import ConflictError, ProtocolError
from protocol.identity import NodeIdentity
from shardcast.format.manifest import load_verified_manifest
from shardcast.format.store import VersionStore, versions_to_prune
from shardcast.origin.publish import publish_checkpoint


def make_checkpoint(root: Path, version: int, size: int = 20_000) -> Path:
    directory = root / f"ckpt{version}"
    (directory / "tok").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(os.urandom(size))
    (directory / "config.json").write_text(f'{{"version": {version}}}')
    (directory / "tok" / "vocab.json").write_text("{}")
    return directory


def test_versions_to_prune() -> None:
    assert versions_to_prune([1, 2, 3, 4, 5], keep=2, protected=[]) == [1, 2, 3]
    assert versions_to_prune([1, 2, 3, 4, 5], keep=2, protected=[2]) == [1, 3]
    assert versions_to_prune([5, 1], keep=3, protected=[]) == []
    with pytest.raises(ValueError):
        versions_to_prune([1], keep=0, protected=[])


def test_publish_writes_verifiable_shards_and_prunes(tmp_path: Path) -> None:
    coordinator = NodeIdentity.generate()
    store = VersionStore(tmp_path / "store")
    for version in range(1, 5):
        signed = publish_checkpoint(
            make_checkpoint(tmp_path, version), version, coordinator, store, shard_size_bytes=4096, keep_versions=2
        )
        assert store.announced() == version
    assert store.versions() == [3, 4]
    assert list(store.staging.iterdir()) == [] and list(store.trash.iterdir()) == []
    raw = store.manifest_path(4).read_bytes()
    manifest = load_verified_manifest(raw, coordinator.node_id, 4).manifest
    assert manifest == signed.manifest
    assert [f.path for f in manifest.files] == ["config.json", "model.safetensors", "tok/vocab.json"]
    ckpt = tmp_path / "ckpt4"
    for entry in manifest.files:  # hard links: the store holds no second copy of the bytes
        assert (store.version_dir(4) / "files" / entry.path).stat().st_ino == (ckpt / entry.path).stat().st_ino


def test_publish_copies_when_links_are_not_wanted(tmp_path: Path) -> None:
    coordinator = NodeIdentity.generate()
    store = VersionStore(tmp_path / "store")
    ckpt = make_checkpoint(tmp_path, 1)
    publish_checkpoint(ckpt, 1, coordinator, store, shard_size_bytes=4096, link_enabled=False)
    stored = store.version_dir(1) / "files" / "model.safetensors"
    assert stored.stat().st_ino != (ckpt / "model.safetensors").stat().st_ino
    assert stored.read_bytes() == (ckpt / "model.safetensors").read_bytes()


def test_republishing_or_going_back_is_refused_and_failures_leave_nothing(tmp_path: Path) -> None:
    coordinator = NodeIdentity.generate()
    store = VersionStore(tmp_path / "store")
    publish_checkpoint(make_checkpoint(tmp_path, 2), 2, coordinator, store, shard_size_bytes=4096)
    with pytest.raises(ConflictError, match="already published"):
        publish_checkpoint(make_checkpoint(tmp_path, 3), 2, coordinator, store, shard_size_bytes=4096)
    with pytest.raises(ConflictError, match="not newer"):
        publish_checkpoint(tmp_path / "ckpt3", 1, coordinator, store, shard_size_bytes=4096)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProtocolError, match="no files"):
        publish_checkpoint(empty, 5, coordinator, store)
    with pytest.raises(ProtocolError, match="shard size"):
        publish_checkpoint(tmp_path / "ckpt3", 6, coordinator, store, shard_size_bytes=100)
    assert store.versions() == [2]
    assert list(store.staging.iterdir()) == []


def test_prune_never_removes_the_protected_version(tmp_path: Path) -> None:
    store = VersionStore(tmp_path)
    for version in (1, 2, 3):
        staged = store.new_staging_dir(f"v{version}")
        store.install_version(staged, version)
    assert store.prune(keep=1, protected={1}) == [2]
    assert store.versions() == [1, 3]


def test_pwrite_all_finishes_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filling disk makes os.pwrite write less than asked; nothing may be silently left out."""
    from shardcast.format.store import pwrite_all

    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real_pwrite(fd, bytes(data)[:3], offset))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        pwrite_all(fd, memoryview(b"0123456789"), 5)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"\0" * 5 + b"0123456789"


def test_a_killed_publish_leaves_nothing_behind_the_next_one(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    (store.staging / "v7-killed" / "files").mkdir(parents=True)
    assert store.clear_leftovers_if_idle()
    assert list(store.staging.iterdir()) == []
    with store.publishing():
        (store.staging / "v8-running").mkdir()
        assert not store.clear_leftovers_if_idle()  # a publish is running: its staging stays
        assert (store.staging / "v8-running").is_dir()
