"""Submissions nobody can audit are closed without judging their worker, through the real API on SQLite and PostgreSQL.

An environment that cannot score a group: a quorum of ``environment_error`` verdicts closes the
submission as ``environment_error``, drops its task, leaves the worker's record alone, frees its lease
room and is counted in ``/v1/stats``; one such vote never counts as a rejection. A submission still
pending when the origin stops keeping its policy version is ``expired`` at the publication (and never
handed to a validator), its task re-issued, the worker's record untouched.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from coordinator.ledger.storage.tables import tasks
from protocol.errors import ForbiddenError, ProtocolError
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, Verdict
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio
FAILURE = "environment: scoring rollout p0/s0 failed: ZeroDivisionError: division by zero"


def unscorable(submission_id: str) -> Verdict:
    return Verdict(submission_id=submission_id, accepted=False, reasons=[FAILURE], environment_error=FAILURE)


async def submitted(worker: LedgerClient) -> tuple[str, str]:
    """(submission id, task id) of a fresh pending submission of ``worker``."""
    (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    answer = await worker.submit(submission_for(task))
    return answer.submission_id, task.task_id


def task_state(harness: LedgerHarness, task_id: str) -> str:
    with harness.database.read() as conn:
        return str(conn.execute(select(tasks.c.state).where(tasks.c.task_id == task_id)).scalar_one())


async def test_a_quorum_of_environment_errors_drops_the_task_and_spares_the_worker(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__validators_per_submission=2, validation__hand_out_claim_s=0.0)
    worker = await harness.worker()
    first, second, third = [await harness.validator() for _ in range(3)]
    submission_id, task_id = await submitted(worker)
    for validator in (first, second, third):  # a verdict counts only on a submission handed to its validator
        assert [item.submission_id for item in (await validator.pending()).submissions] == [submission_id]

    assert (await first.post_verdict(unscorable(submission_id))).status == "pending"
    rejection = Verdict(submission_id=submission_id, accepted=False, reasons=["rollout p0/s0: proof: bad"])
    assert (await second.post_verdict(rejection)).status == "pending", "an environment error is not a rejection"
    answer = await third.post_verdict(unscorable(submission_id))
    assert (answer.status, answer.worker_banned) == ("environment_error", False)

    assert task_state(harness, task_id) == "dropped"
    stats = await worker.stats()
    assert stats.status.num_submissions_environment_error == 1
    assert (stats.status.num_submissions_pending, stats.status.num_submissions_rejected) == (0, 0)
    (row,) = [node for node in stats.nodes if node.node_id == worker.identity.node_id]
    assert (row.num_accepted, row.num_rejected, row.banned) == (0, 0, False)
    (void,) = [event for event in (await worker.events(limit=1000)).events if event.kind == "void"]
    assert void.subject == submission_id
    assert void.data["status"] == "environment_error" and void.data["reasons"] == [FAILURE]
    assert void.data["task_state"] == "dropped"
    assert not (await first.pending()).submissions


async def test_an_environment_error_verdict_cannot_accept_or_carry_rewards(harness: LedgerHarness) -> None:
    worker = await harness.worker()
    validator = await harness.validator()
    submission_id, _task_id = await submitted(worker)
    await validator.pending()
    for change in ({"accepted": True}, {"rewards": [0.5] * 4}):
        with pytest.raises(ProtocolError, match="accepts nothing and carries no rewards"):
            await validator.post_verdict(unscorable(submission_id).model_copy(update=change))
    assert (await validator.post_verdict(unscorable(submission_id))).status == "environment_error"


async def test_a_submission_whose_version_the_origin_dropped_expires_and_its_task_is_reissued(
    make_harness: MakeHarness,
) -> None:
    harness = make_harness(scheduling__async_level=1, policy__keep_versions=2)
    worker = await harness.worker()
    stale_id, stale_task = await submitted(worker)  # made with v0, never audited (no validator yet)
    harness.ledger.publish(signed_manifest(harness.coordinator, 1))
    assert (await worker.status()).num_submissions_pending == 1, "v0 is still kept with v1 current"
    fresh_id, _fresh_task = await submitted(worker)  # made with v1
    harness.ledger.publish(signed_manifest(harness.coordinator, 2))  # the origin keeps v1 and v2 now

    status = await worker.status()
    assert (status.num_submissions_expired, status.num_submissions_pending) == (1, 1)
    assert task_state(harness, stale_task) == "open", "the task is re-issued at the current version"
    validator = await harness.validator()
    handed = [item.submission_id for item in (await validator.pending()).submissions]
    assert handed == [fresh_id], "a validator is never handed a submission whose version is gone"
    stats = await worker.stats()
    (row,) = [node for node in stats.nodes if node.node_id == worker.identity.node_id]
    assert (row.num_accepted, row.num_rejected) == (0, 0)
    (void,) = [event for event in (await worker.events(limit=1000)).events if event.kind == "void"]
    assert void.subject == stale_id and void.data["status"] == "expired"
    assert "policy v0 is no longer kept by the origin" in str(void.data["reasons"])
    late = Verdict(submission_id=stale_id, accepted=True, rewards=[0.5] * 4)
    with pytest.raises(ForbiddenError, match="never handed"):  # a late verdict changes nothing
        await validator.post_verdict(late)
    assert (await worker.status()).num_submissions_expired == 1
