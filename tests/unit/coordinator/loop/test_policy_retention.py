"""The origin store's retention: one policy function, never the current version or a kept base."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.loop.policies import origin_versions_to_remove, prune_origin
from shardcast.store import VersionStore


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
