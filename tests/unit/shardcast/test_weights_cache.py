"""A policy version in use is never pruned: pins in WeightsCache, and who pins what (worker, validator, relay)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest

from engines.base import GenerationRequest, GenerationResult
from environments.base import Scores
from environments.builtin import builtin_environment
from protocol.errors import VersionRefusedError
from protocol.schemas import Prompt, SamplingParams, Task
from shardcast.client import cache as cache_module
from shardcast.client.cache import WeightsCache
from shardcast.relay.config import RelayConfig
from shardcast.relay.mirror import RelayMirror
from validator.run import LoadedPolicy, PolicyEngines
from worker.loop import TaskRunner, WorkerState

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WeightsCache:
    """A cache whose downloads just create the version's directory (no relay needed)."""

    async def fake_fetch(
        version: int, relays: Any, coordinator_id: str, dest_root: Path, options: Any, run_name: str | None = None
    ) -> Path:
        path = dest_root / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}")
        return path

    monkeypatch.setattr(cache_module, "fetch_version", fake_fetch)
    return WeightsCache(["http://127.0.0.1:9"], "12D3KooWcoordinator", tmp_path / "policies", keep_versions=3)


async def test_a_pinned_version_survives_newer_downloads_and_goes_when_unpinned(cache: WeightsCache) -> None:
    await cache.ensure(0)
    cache.pin(0)  # an engine is starting on it
    for version in range(1, 7):
        await cache.ensure(version)
    assert cache.held_versions() == [0, 4, 5, 6]
    cache.unpin(0)
    assert cache.held_versions() == [4, 5, 6]


async def test_pins_add_up_and_pinned_blocks_release_them(cache: WeightsCache) -> None:
    for version in range(4):
        await cache.ensure(version)
    assert cache.held_versions() == [1, 2, 3]
    cache.pin(1)
    with cache.pinned(1, 2):
        for version in range(4, 7):
            await cache.ensure(version)
        assert cache.in_use() == {1, 2}
        assert cache.held_versions() == [1, 2, 4, 5, 6]
    assert cache.held_versions() == [1, 4, 5, 6]  # one pin of v1 is still held
    cache.unpin(1)
    assert cache.held_versions() == [4, 5, 6]
    with pytest.raises(ValueError, match="not pinned"):
        cache.unpin(1)


async def test_a_pruned_version_is_downloaded_again_when_asked(cache: WeightsCache) -> None:
    for version in range(5):
        await cache.ensure(version)
    assert 0 not in cache.held_versions()
    path = await cache.ensure(0)
    assert path.is_dir()


class RecordingEngine:
    """An engine that records which versions the cache protects while it works."""

    name = "hf"

    def __init__(self, weights: WeightsCache, fail: bool = False) -> None:
        self.weights = weights
        self.fail = fail
        self.loaded: list[Path] = []
        self.in_use_while_generating: set[int] = set()

    def load_weights(self, path: Path) -> None:
        assert path.is_dir(), f"{path} was pruned while loading"
        self.loaded.append(path)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.in_use_while_generating = self.weights.in_use()
        if self.fail:
            raise RuntimeError("engine crashed")
        return []

    def close(self) -> None:
        pass


class QuietLedger:
    def __init__(self) -> None:
        self.abandoned: list[str] = []

    async def renew(self, lease_id: str) -> Any:
        raise AssertionError("no renewal expected in a short test")

    async def abandon(self, lease_id: str) -> None:
        self.abandoned.append(lease_id)


def task_of(version: int) -> Task:
    return Task(
        task_id=f"t-{version}",
        lease_id=f"l-{version}",
        task_name="count",
        prompts=[Prompt(prompt_index=0, token_ids=[1, 2])],
        group_size=1,
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        policy_version=version,
        sampling_seed=7,
        deadline=time.time() + 60,
    )


async def test_the_worker_pins_its_loaded_version_and_the_leased_tasks_version(cache: WeightsCache) -> None:
    await cache.ensure(0)
    engine = RecordingEngine(cache, fail=True)
    runner = TaskRunner(QuietLedger(), engine, cache, WorkerState(), (), loaded_version=0)  # type: ignore[arg-type]
    assert cache.in_use() == {0}
    for version in range(1, 5):  # newer versions arrive by gossip
        await cache.ensure(version)
    assert 0 in cache.held_versions()
    with pytest.raises(RuntimeError, match="engine crashed"):
        finish = await runner.generate_task(task_of(4), asyncio.Event())
        assert finish is not None
        finish.close()
    assert engine.in_use_while_generating == {4}  # loaded v4 (pinned) for a task of v4 (pinned)
    assert cache.in_use() == {4}  # the task's pin is released; the engine's moved from v0 to v4
    held = cache.held_versions()
    assert 0 not in held and 4 in held


async def test_the_validator_pins_versions_whose_engine_is_loaded(
    cache: WeightsCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = PolicyEngines(cache, max_loaded=2, max_batch_size=1, environment=builtin_environment("reverse_text"))

    async def fake_load(version: int) -> LoadedPolicy:
        path = await cache.ensure(version)
        assert path.is_dir()
        return LoadedPolicy(cast(Any, RecordingEngine(cache)), (), lambda *args: Scores.single("none", 0.0), None)

    monkeypatch.setattr(engines, "_load", fake_load)
    await engines.get(0)
    await engines.get(1)
    for version in range(2, 6):
        await cache.ensure(version)
    assert cache.held_versions() == [0, 1, 3, 4, 5]
    await engines.get(5)  # v0's engine is dropped, and with it its pin
    assert cache.in_use() == {1, 5}
    assert cache.held_versions() == [1, 3, 4, 5]
    engines.close()
    assert cache.in_use() == set()
    assert cache.held_versions() == [3, 4, 5]


async def test_a_relay_keeps_an_old_version_while_it_is_being_served(tmp_path: Path) -> None:
    config = RelayConfig(upstreams=["http://127.0.0.1:9"], data_dir=tmp_path / "relay", keep_versions=2, in_use_s=30)
    relay = RelayMirror(config, "12D3KooWcoordinator")
    try:
        for version in range(3):
            relay.store.version_dir(version).mkdir(parents=True)
            relay.versions[version] = make_mirrored(version)
        relay.manifest_bytes(0)  # a node started downloading v0
        relay._prune()
        assert sorted(relay.versions) == [0, 1, 2]
        relay.last_served[0] = time.monotonic() - 31  # and finished a while ago
        relay._prune()
        assert sorted(relay.versions) == [1, 2]
        assert not relay.store.version_dir(0).exists()
    finally:
        await relay.aclose()


def make_mirrored(version: int) -> Any:
    from shardcast.relay.mirror import MirroredVersion

    class Manifest:
        pass

    manifest = Manifest()
    manifest.version = version  # type: ignore[attr-defined]
    manifest.shards = []  # type: ignore[attr-defined]
    manifest.total_size_bytes = 0  # type: ignore[attr-defined]
    manifest.kind = "full"  # type: ignore[attr-defined]
    manifest.base_version = None  # type: ignore[attr-defined]
    manifest.served_on = None  # type: ignore[attr-defined]
    return MirroredVersion(b"{}", manifest, [])  # type: ignore[arg-type]


async def test_a_task_of_a_refused_version_is_handed_back_and_the_version_never_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[int] = []

    async def refusing_fetch(
        version: int, relays: Any, coordinator_id: str, dest_root: Path, options: Any, run_name: str | None = None
    ) -> Path:
        fetched.append(version)
        if version == 1:
            raise VersionRefusedError("version 1 cannot be rebuilt: the patch of v1 against v0 was refused (bad)")
        path = dest_root / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    monkeypatch.setattr(cache_module, "fetch_version", refusing_fetch)
    weights = WeightsCache(["http://127.0.0.1:9"], "12D3KooWcoordinator", tmp_path / "policies")
    await weights.ensure(0)
    ledger, state = QuietLedger(), WorkerState()
    runner = TaskRunner(ledger, RecordingEngine(weights), weights, state, (), loaded_version=0)  # type: ignore[arg-type]
    for _ in range(3):  # the ledger leases tasks of the refused version again and again
        assert await runner.generate_task(task_of(1), asyncio.Event()) is None
    assert ledger.abandoned == ["l-1"] * 3  # each handed back at once, so the ledger can re-issue it
    assert fetched == [0, 1]  # the refused version was downloaded once
    assert state.last_error is not None and "policy v1 refused" in state.last_error
    assert runner.loaded_version == 0 and weights.in_use() == {0}  # still serving what it has
