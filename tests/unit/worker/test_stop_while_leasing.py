"""A worker stopped while a lease call is in flight hands back the lease the ledger granted as it stopped: held
by nobody, the task would wait out its lease before anyone else could take it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol.schemas import LeaseResponse, Prompt, SamplingParams, Task
from worker.loop import TaskRunner, WorkerState, run_jobs_until_stopped


def granted(lease_id: str) -> Task:
    return Task(
        task_id="t-1",
        lease_id=lease_id,
        task_name="count",
        prompts=[Prompt(prompt_index=0, token_ids=[1, 2])],
        group_size=1,
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        policy_version=0,
        sampling_seed=7,
        deadline=time.time() + 60,
    )


class GrantingAsItStops:
    """A ledger whose long-poll grants a lease just after the worker was told to stop."""

    def __init__(self, stop: asyncio.Event, answer_after_stop_s: float) -> None:
        self.stop = stop
        self.answer_after_stop_s = answer_after_stop_s
        self.abandoned: list[str] = []

    async def lease(self, request: Any, long_poll_s: float) -> LeaseResponse:
        await self.stop.wait()
        await asyncio.sleep(self.answer_after_stop_s)
        return LeaseResponse(tasks=[granted("l-late")], retry_after_s=0)

    async def abandon(self, lease_id: str) -> None:
        self.abandoned.append(lease_id)


class NoWeights:
    def held_versions(self) -> list[int]:
        return [0]


def stop_while_leasing(answer_after_stop_s: float) -> list[str]:
    """The lease ids a worker's runner abandoned, stopped while its lease call was in flight, as the node stops it
    (its jobs are ended by the node, not only told to stop)."""

    async def scenario() -> list[str]:
        stop = asyncio.Event()
        ledger = GrantingAsItStops(stop, answer_after_stop_s)
        runner = TaskRunner(ledger, None, NoWeights(), WorkerState(), ())  # type: ignore[arg-type]
        running = asyncio.create_task(run_jobs_until_stopped([asyncio.create_task(runner.run(stop))], stop))
        await asyncio.sleep(0.05)  # the lease call is in flight
        stop.set()
        started = time.monotonic()
        await asyncio.wait_for(running, timeout=5)
        assert time.monotonic() - started < 2.0  # a long-poll never holds the stop up for long
        return ledger.abandoned

    return asyncio.run(scenario())


def test_a_lease_granted_as_the_worker_stops_is_abandoned() -> None:
    assert stop_while_leasing(0.05) == ["l-late"]


def test_a_lease_call_that_keeps_waiting_is_cut_off() -> None:
    assert stop_while_leasing(30.0) == []
