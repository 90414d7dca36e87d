"""Where a task goes when its lease ends, and what the worker is told, on SQLite and PostgreSQL, through the API.

A rejected or abandoned task goes back to the queue, but never straight back to a node that held
it (a worker leasing one task at a time would otherwise get the same task again and again), and a
lease that the policy overtook says so instead of blaming a missed renewal.
"""

from __future__ import annotations

import pytest

from protocol.errors import ConflictError
from protocol.schemas import LeaseRequest, Verdict
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import MakeHarness

pytestmark = pytest.mark.anyio


async def test_a_rejected_or_abandoned_task_never_comes_straight_back(make_harness: MakeHarness) -> None:
    harness = make_harness()
    worker, other, validator = await harness.worker(), await harness.worker(), await harness.validator()
    (rejected,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    submission_id = (await worker.submit(submission_for(rejected))).submission_id
    await validator.pending()
    await validator.post_verdict(Verdict(submission_id=submission_id, accepted=False, reasons=["bad proof"]))
    (dropped,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    assert dropped.task_id != rejected.task_id
    await worker.abandon(dropped.lease_id)
    for _ in range(3):  # one task at a time, again and again: never either of them
        (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
        assert task.task_id not in (rejected.task_id, dropped.task_id)
        await worker.submit(submission_for(task))
    retried = {task.task_id for task in (await other.lease(LeaseRequest(max_tasks=2))).tasks}
    assert retried == {rejected.task_id, dropped.task_id}  # first in line for everyone else
    for client in (worker, other, validator):
        await client.aclose()


async def test_a_lease_the_policy_overtook_says_so(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__async_level=1)
    worker, other = await harness.worker(), await harness.worker()
    coordinator = harness.client(harness.coordinator)
    (task,) = (await worker.lease(LeaseRequest())).tasks
    for version in (1, 2):
        await coordinator.publish(signed_manifest(harness.coordinator, version))
    (reissued,) = (await other.lease(LeaseRequest(policy_versions_held=[2]))).tasks
    assert reissued.task_id == task.task_id
    with pytest.raises(ConflictError, match="policy moved on") as refused:
        await worker.submit(submission_for(task))
    assert "renew" not in refused.value.message
    with pytest.raises(ConflictError, match="policy moved on") as refused:
        await worker.renew(task.lease_id)
    assert "renew leases" not in refused.value.message
    # A lease that did run out is still told to renew.
    (late,) = (await worker.lease(LeaseRequest(policy_versions_held=[2]))).tasks
    harness.clock.advance(harness.config.scheduling.lease_ttl_s + 1)
    assert harness.ledger.expire_overdue() == 2  # late's, and other's
    await other.lease(LeaseRequest(policy_versions_held=[2]))
    with pytest.raises(ConflictError, match="deadline passed before it was renewed"):
        await worker.renew(late.lease_id)
    for client in (worker, other, coordinator):
        await client.aclose()
