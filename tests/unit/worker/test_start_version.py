"""A worker whose start version is refused waits for a newer one instead of exiting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import worker.join
from protocol.schemas import RunStatus


class Ledger:
    """Answers the run status with the versions given, one per call (the last one from then on)."""

    def __init__(self, versions: list[int]) -> None:
        self.versions = versions
        self.calls = 0

    async def status(self) -> RunStatus:
        version = self.versions[min(self.calls, len(self.versions) - 1)]
        self.calls += 1
        counts = dict.fromkeys(
            (
                "num_workers_live",
                "num_validators_live",
                "num_tasks_open",
                "num_submissions_pending",
                "num_submissions_accepted",
                "num_submissions_rejected",
            ),
            0,
        )
        return RunStatus(run_name="r", current_policy_version=version, async_level=1, **counts)


def test_the_next_published_version_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker.join, "NEWER_VERSION_POLL_S", 0.01)
    ledger = Ledger([3, 3, 3, 4])
    found = asyncio.run(worker.join.newer_policy_version(ledger, 3, asyncio.Event()))  # type: ignore[arg-type]
    assert (found, ledger.calls) == (4, 4)


def test_a_stop_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker.join, "NEWER_VERSION_POLL_S", 0.01)

    async def wait_then_stop() -> Any:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        return await worker.join.newer_policy_version(Ledger([2]), 2, stop)  # type: ignore[arg-type]

    with pytest.raises(asyncio.CancelledError, match="newer than v2"):
        asyncio.run(wait_then_stop())
