"""Rows an older ledger stored before the door checks never fail a later request, on SQLite and PostgreSQL.

Each test writes what the old ledger let through straight into the database (a vote whose NaN
rewards pydantic stored as null, a submission body today's schema refuses, an event with NaN,
a node with an infinite tokens/s and an absurd version held) and then reads and acts through
the API: every answer is 200, and the submission concerned still gets decided.
"""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import insert, select, update

from coordinator.ledger.storage.tables import events, hand_outs, nodes, submissions, tasks, verdict_votes
from coordinator.ledger.validation import UNREADABLE_SUBMISSION
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, Verdict
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import LedgerHarness

pytestmark = pytest.mark.anyio


async def submitted(worker: LedgerClient) -> tuple[str, int]:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    request = submission_for(task)
    return (await worker.submit(request)).submission_id, len(request.rollouts)


async def test_a_stored_nan_vote_does_not_wedge_the_submission(harness: LedgerHarness, worker: LedgerClient) -> None:
    submission_id, num_rollouts = await submitted(worker)
    old_validator, new_validator = await harness.validator(), await harness.validator()
    # What the old ledger stored for rewards of NaN: pydantic wrote them as null; the vote decided nothing.
    stored = {"v": 1, "submission_id": submission_id, "accepted": True, "reasons": [], "rewards": [None] * num_rollouts}
    with harness.database.write() as conn:
        conn.execute(
            insert(verdict_votes).values(
                submission_id=submission_id,
                validator_id=old_validator.identity.node_id,
                accepted=True,
                verdict_json=json.dumps(stored),
                posted_at=harness.clock(),
            )
        )
    honest = Verdict(submission_id=submission_id, accepted=True, rewards=[0.5] * num_rollouts)
    with harness.database.write() as conn:  # the old ledger had handed it over, too
        conn.execute(
            insert(hand_outs).values(
                submission_id=submission_id,
                validator_id=old_validator.identity.node_id,
                handed_at=harness.clock(),
                expires_at=harness.clock() + 60,
            )
        )
    again = await old_validator.post_verdict(honest)  # its vote stands; answered, not a 500
    assert again.status == "pending"
    assert (await new_validator.pending()).submissions[0].submission_id == submission_id
    decided = await new_validator.post_verdict(honest)
    assert decided.status == "accepted"
    for client in (old_validator, new_validator):
        await client.aclose()


async def test_a_stored_body_the_schema_now_refuses_is_rejected_not_served(
    harness: LedgerHarness, worker: LedgerClient
) -> None:
    submission_id, _num_rollouts = await submitted(worker)
    good_id, _ = await submitted(worker)
    with harness.database.write() as conn:
        row = conn.execute(select(submissions).where(submissions.c.submission_id == submission_id)).one()
        body = json.loads(row.body_json)
        body["rollouts"][0]["logprobs"][0] = -1e30  # beyond today's bound on a logprob's magnitude
        conn.execute(
            update(submissions).where(submissions.c.submission_id == submission_id).values(body_json=json.dumps(body))
        )
    validator = await harness.validator()
    listed = [item.submission_id for item in (await validator.pending()).submissions]
    assert listed == [good_id]
    with harness.database.read() as conn:
        row = conn.execute(select(submissions).where(submissions.c.submission_id == submission_id)).one()
        task = conn.execute(select(tasks).where(tasks.c.task_id == row.task_id)).one()
        worker_row = conn.execute(select(nodes).where(nodes.c.node_id == worker.identity.node_id)).one()
    assert row.status == "rejected" and task.state == "open"
    assert Verdict.model_validate_json(row.verdict_json).reasons == [UNREADABLE_SUBMISSION]
    assert worker_row.num_rejected == 0  # it passed the checks of its day
    assert (await validator.pending()).submissions[0].submission_id == good_id
    await validator.aclose()


async def test_stored_nan_events_and_absurd_node_numbers_read_back(
    harness: LedgerHarness, worker: LedgerClient
) -> None:
    with harness.database.write() as conn:
        conn.execute(
            insert(events).values(
                at=harness.clock(), kind="vote", node_id=None, subject="s-old", data_json='{"rewards":[NaN,Infinity]}'
            )
        )
        # PostgreSQL stores NaN and infinities in DOUBLE PRECISION; SQLite stores infinities (NaN would be NULL).
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == worker.identity.node_id)
            .values(tokens_per_s=float("inf"), versions_held_json="[0, 99999999999999]")
        )
    page = await worker.events(limit=1000)
    (old,) = [event for event in page.events if event.subject == "s-old"]
    assert old.data == {"rewards": [None, None]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger") as http:
        response = await http.get("/v1/dashboard")
    assert response.status_code == 200, response.text
    (node,) = [n for n in response.json()["nodes"] if n["node_id"] == worker.identity.node_id]
    assert node["tokens_per_s"] == 0.0 and node["versions_held"] == [0]
