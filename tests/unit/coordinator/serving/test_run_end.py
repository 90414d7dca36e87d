"""The end of a run reaches its nodes: once the last step is published, leases and empty pending lists are refused
with `run_ended` (410), what is pending is still handed out, and the ledger remembers who has heard."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import insert

from coordinator.ledger.storage.tables import train_steps
from protocol.errors import RunEndedError
from protocol.schemas import LeaseRequest
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import MakeHarness

pytestmark = pytest.mark.anyio


async def test_after_the_last_step_nodes_are_told_the_run_ended(make_harness: MakeHarness) -> None:
    harness = make_harness(orchestrator__enabled=True, orchestrator__num_steps=1)
    worker, validator, late = await harness.worker(), await harness.validator(), await harness.validator()
    (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    await worker.submit(submission_for(task))
    assert not (await worker.status()).run_ended

    with harness.database.write() as conn:  # what the orchestrator records when it publishes the last step
        conn.execute(insert(train_steps).values(step=1, state="published", min_policy_version=0, recorded_at=0.0))
    await asyncio.sleep(1.1)  # the ledger looks for the end at most once a second

    with pytest.raises(RunEndedError, match="has ended"):
        await worker.lease(LeaseRequest(max_tasks=1))
    assert (await worker.status()).run_ended
    # the submission made before the end is still audited; a validator with nothing left is told
    assert [s.submission_id for s in (await validator.pending(limit=16)).submissions]
    assert harness.ledger.told_run_end == {worker.identity.node_id}
    with harness.database.write() as conn:  # a validator that has nothing to audit: no pending submission at all
        conn.exec_driver_sql("UPDATE submissions SET status = 'accepted'")
    with pytest.raises(RunEndedError):
        await late.pending(limit=16)
    assert harness.ledger.told_run_end == {worker.identity.node_id, late.identity.node_id}
    for client in (worker, validator, late):
        await client.aclose()


async def test_a_run_without_an_orchestrator_never_ends(make_harness: MakeHarness) -> None:
    harness = make_harness()
    worker = await harness.worker()
    await asyncio.sleep(1.1)
    assert (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    assert not (await worker.status()).run_ended
    await worker.aclose()
