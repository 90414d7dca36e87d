"""The origin store's retention: one policy function, never the current version or a kept base."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.loop.policies import origin_versions_to_remove, prune_origin
from shardcast.format.store import VersionStore


def test_origin_keeps_the_newest_versions_the_current_one_and_bases() -> None:
    assert origin_versions_to_remove(range(10), current=9, keep_versions=3) == [0, 1, 2, 3, 4, 5, 6]
    assert origin_versions_to_remove(range(10), current=9, keep_versions=3, bases=[0, 5]) == [1, 2, 3, 4, 6]
    # A current version that is not among the newest (a store ahead of the ledger) is kept too.
    assert origin_versions_to_remove(range(10), current=4, keep_versions=2) == [0, 1, 2, 3, 5, 6, 7]
    assert origin_versions_to_remove([3], current=3, keep_versions=1) == []


def test_prune_origin_keeps_what_a_worker_k_versions_behind_downloads(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    for version in range(8):
        (store.version_dir(version) / "files").mkdir(parents=True)
    config = CoordinatorConfig(data_dir=tmp_path, scheduling={"async_level": 2})
    assert config.policy_keep_versions == 4
    assert prune_origin(store, config, current=7) == [0, 1, 2, 3]
    # Every version a submission may still be made with (current - k .. current) stays downloadable.
    assert set(range(7 - 2, 8)) <= set(store.versions()) and store.versions() == [4, 5, 6, 7]
    assert prune_origin(store, config, current=7) == []


def test_prune_origin_keeps_the_chain_a_kept_patch_stands_on(tmp_path: Path) -> None:
    from protocol.identity import load_or_create_identity
    from shardcast.origin.publish import PatchPolicy, publish_checkpoint

    store = VersionStore(tmp_path / "store")
    signer = load_or_create_identity(tmp_path / "key")
    payload = bytearray(64 * 1024)
    config = CoordinatorConfig(data_dir=tmp_path, policy={"keep_versions": 3})
    for version in range(8):  # full_every 5: F0 P1 P2 P3 P4 F5 P6 P7
        checkpoint = tmp_path / f"ckpt{version}"
        checkpoint.mkdir()
        payload[version * 7] = version + 1  # one byte moves per version: every patch is tiny
        (checkpoint / "weights.bin").write_bytes(bytes(payload))
        signed = publish_checkpoint(
            checkpoint, version, signer, store, 4096, keep_versions=None, fsync_enabled=False,
            patches=PatchPolicy(full_every=5),
        )  # fmt: skip
        assert signed.manifest.kind == ("full" if version % 5 == 0 else "patch")
        if version == 6:  # the newest three (4, 5, 6) include the patch v4, whose chain goes down to v0
            assert prune_origin(store, config, current=6) == []
    # the newest three (5, 6, 7) stand on the full v5: 0..4 go
    assert prune_origin(store, config, current=7) == [0, 1, 2, 3, 4]
    assert store.versions() == [5, 6, 7]
