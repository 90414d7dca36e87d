"""What a worker does with accepted gossip: fetch announced versions (retrying while relays mirror), learn relays."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from node.gossip import MAX_LEARNED_RELAYS, WorkerGossipHandler
from node.retry import sleep_until_work
from protocol.announcements import KIND_OF_BODY, Accepted
from protocol.errors import IntegrityError, NotFoundError
from protocol.schemas import PolicyAnnouncement, RelayAnnouncement, TaskAnnouncement
from shardcast.client.cache import WeightsCache

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class StubWeights:
    """Stands in for WeightsCache: records ensure() calls and fails the first ``failures`` of them."""

    def __init__(self, held: list[int], failures: list[Exception]) -> None:
        self.relays = ["http://relay-a:8100"]
        self.held = held
        self.failures = failures
        self.asked: list[int] = []

    def held_versions(self) -> list[int]:
        return list(self.held)

    async def ensure(self, version: int) -> Path:
        self.asked.append(version)
        if self.failures:
            raise self.failures.pop(0)
        self.held.append(version)
        return Path(f"v{version}")


def accepted(body: PolicyAnnouncement | RelayAnnouncement | TaskAnnouncement) -> Accepted:
    return Accepted(kind=KIND_OF_BODY[type(body)], signer="12D3KooWcoordinator", sent_at=time.time(), body=body)


def policy(version: int) -> PolicyAnnouncement:
    return PolicyAnnouncement(version=version, manifest_sha256="ab" * 32, total_size_bytes=1, published_at=time.time())


def handler_with(weights: StubWeights, work: asyncio.Event | None = None) -> WorkerGossipHandler:
    return WorkerGossipHandler(asyncio.get_running_loop(), weights, asyncio.Event(), work)  # type: ignore[arg-type]


async def test_an_announced_version_is_fetched_at_once_retrying_while_relays_mirror() -> None:
    weights = StubWeights(held=[0], failures=[NotFoundError("no relay holds it yet")])
    handler = handler_with(weights)
    handler.handle(accepted(policy(1)))
    handler.handle(accepted(policy(1)))  # a second word about the same version starts nothing new
    handler.handle(accepted(policy(0)))  # already held
    await asyncio.wait_for(handler.fetches[1], timeout=5)
    assert weights.asked == [1, 1] and weights.held == [0, 1]
    assert list(handler.fetches) == [1]


async def test_a_fetch_that_fails_verification_is_left_to_the_task_loop(caplog: pytest.LogCaptureFixture) -> None:
    weights = StubWeights(held=[], failures=[IntegrityError("shard 3 does not match the manifest")])
    handler = handler_with(weights)
    handler.handle(accepted(policy(4)))
    await asyncio.wait_for(handler.fetches[4], timeout=5)
    assert weights.asked == [4] and "prefetch of announced policy v4 failed" in caplog.text


async def test_relays_are_learned_once_and_up_to_a_cap() -> None:
    weights = StubWeights(held=[], failures=[])
    handler = handler_with(weights)
    handler.handle(accepted(RelayAnnouncement(url="http://relay-a:8100/")))  # already known
    for index in range(MAX_LEARNED_RELAYS + 5):
        handler.handle(accepted(RelayAnnouncement(url=f"http://relay-{index}:8100")))
        handler.handle(accepted(RelayAnnouncement(url=f"http://relay-{index}:8100")))
    assert weights.relays[0] == "http://relay-a:8100"
    assert len(weights.relays) == 1 + MAX_LEARNED_RELAYS == len(set(weights.relays))


async def test_task_availability_wakes_an_idle_task_loop() -> None:
    work = asyncio.Event()
    handler = handler_with(StubWeights(held=[], failures=[]), work)
    started = time.monotonic()
    sleeper = asyncio.create_task(sleep_until_work(asyncio.Event(), work, 30.0))
    await asyncio.sleep(0.05)
    handler.handle(accepted(TaskAnnouncement(num_tasks_open=2, current_policy_version=0)))
    await asyncio.wait_for(sleeper, timeout=5)
    assert time.monotonic() - started < 5


async def test_the_real_weights_cache_fits_the_handler(tmp_path: Path) -> None:
    cache = WeightsCache(["http://127.0.0.1:9"], "12D3KooWcoordinator", tmp_path)
    handler = WorkerGossipHandler(asyncio.get_running_loop(), cache, asyncio.Event())
    handler.handle(accepted(RelayAnnouncement(url="http://relay-b:8100")))
    assert cache.relays == ["http://127.0.0.1:9", "http://relay-b:8100"]


async def test_a_restarted_worker_does_not_prefetch_the_replayed_older_versions() -> None:
    """Restarted with v23 on disk, a worker heard v10..v15 and v1..v9 again (the last minute of gossip) and
    fetched them all at once, racing the pruning of old versions ("v1 is not a directory"); only newer count."""
    weights = StubWeights(held=[23], failures=[])
    handler = handler_with(weights)
    for version in [*range(10, 16), *range(1, 10), 24]:
        handler.handle(accepted(policy(version)))
    await asyncio.wait_for(handler.fetches[24], timeout=5)
    handler.handle(accepted(policy(22)))  # older than a version being fetched or held: ignored too
    assert weights.asked == [24] and list(handler.fetches) == [24]
