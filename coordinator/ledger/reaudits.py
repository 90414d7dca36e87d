"""Re-audits: accepted submissions audited again, after the fact, on the samples nobody recomputed.

When adaptive audit accepts a submission of which validators recomputed only some samples, a
keyed coin (:func:`coordinator.ledger.audit_choice.reaudit_chosen`, probability ``reaudit_share``)
decides whether its other samples are recomputed later; :func:`schedule` stores that as a row of
``reaudits``. Validators find re-audits in their pending list (``PendingSubmission.reaudit``) and
judge them like any submission. ``validation.validators_per_submission`` agreeing votes decide one
(:func:`vote`): passed (or an environment that could not score it) changes nothing; failed catches
the worker after the fact: the caller starts
its record over, voids its credit, counts the rejection toward its ban, and :func:`void_untrained`
takes its accepted work that no training step holds yet out of training (re-opening those tasks)
and has its pending submissions recomputed whole. A training step a breaker refused has its submissions
audited again on every sample (:func:`request_full`); those that fail are taken out of the step and
voided (:func:`void_submissions`) before it is rebuilt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy import Connection, Row, delete, insert, select, update

from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import accepted_groups, reaudits, step_submissions, submissions, tasks
from protocol.schemas import Verdict

Outcome = Literal["pending", "passed", "failed"]
EventFn = Callable[..., None]


def schedule(conn: Connection, sub: Row[Any], unchecked: list[int], now: float) -> None:
    """Re-audit ``sub`` (just accepted) on the rollout positions ``unchecked``."""
    conn.execute(
        insert(reaudits).values(
            submission_id=sub.submission_id,
            node_id=sub.node_id,
            positions_json=json.dumps(unchecked),
            state="pending",
            votes_json="[]",
            created_at=now,
        )
    )


def request_full(conn: Connection, submission_id: str, node_id: str, num_rollouts: int, now: float) -> None:
    """Re-audit an accepted submission on every rollout, from now: any earlier re-audit row of it is replaced."""
    conn.execute(delete(reaudits).where(reaudits.c.submission_id == submission_id))
    conn.execute(
        insert(reaudits).values(
            submission_id=submission_id,
            node_id=node_id,
            positions_json=json.dumps(list(range(num_rollouts))),
            state="pending",
            votes_json="[]",
            created_at=now,
        )
    )


def states(db: Database, submission_ids: list[str]) -> dict[str, str]:
    """The re-audit state of each of these submissions that has one."""
    if not submission_ids:
        return {}
    with db.read() as conn:
        rows = conn.execute(
            select(reaudits.c.submission_id, reaudits.c.state).where(reaudits.c.submission_id.in_(submission_ids))
        ).all()
    return {row.submission_id: row.state for row in rows}


def passed_positions(conn: Connection, submission_ids: list[str]) -> dict[str, set[int]]:
    """The rollout positions a passed re-audit recomputed, per submission that has one."""
    if not submission_ids:
        return {}
    rows = conn.execute(
        select(reaudits.c.submission_id, reaudits.c.positions_json).where(
            reaudits.c.submission_id.in_(submission_ids), reaudits.c.state == "passed"
        )
    ).all()
    return {row.submission_id: set(json.loads(row.positions_json)) for row in rows}


def open_reaudit(conn: Connection, submission_id: str) -> Row[Any] | None:
    """The pending re-audit of a submission, locked, or None."""
    return conn.execute(
        select(reaudits)
        .where(reaudits.c.submission_id == submission_id, reaudits.c.state == "pending")
        .with_for_update()
    ).first()


def pending_for(conn: Connection, validator_id: str, limit: int) -> list[Row[Any]]:
    """Pending re-audits this validator has not voted on, oldest first."""
    if limit <= 0:
        return []
    rows = conn.execute(
        select(reaudits).where(reaudits.c.state == "pending").order_by(reaudits.c.created_at).limit(limit * 4)
    ).all()
    return [row for row in rows if validator_id not in voters(row)][:limit]


def voters(row: Row[Any]) -> set[str]:
    return {vote["validator_id"] for vote in json.loads(row.votes_json)}


def vote(conn: Connection, row: Row[Any], validator_id: str, verdict: Verdict, quorum: int, now: float) -> Outcome:
    """Record a validator's vote on a re-audit; the outcome once ``quorum`` votes agree."""
    if verdict.environment_error is not None:  # the environment's failure, not the worker's: nothing to judge by
        unscored = {"state": "environment_error", "decided_at": now}
        conn.execute(update(reaudits).where(reaudits.c.submission_id == row.submission_id).values(**unscored))
        return "passed"
    votes = json.loads(row.votes_json)
    if validator_id not in voters(row):
        votes.append({"validator_id": validator_id, "accepted": verdict.accepted, "reasons": verdict.reasons[:8]})
    passed = sum(1 for v in votes if v["accepted"])
    failed = len(votes) - passed
    outcome: Outcome = "passed" if passed >= quorum else "failed" if failed >= quorum else "pending"
    values: dict[str, Any] = {"votes_json": json.dumps(votes), "state": outcome}
    if outcome != "pending":
        values["decided_at"] = now
    conn.execute(update(reaudits).where(reaudits.c.submission_id == row.submission_id).values(**values))
    return outcome


def void_untrained(conn: Connection, node_id: str, reason: str, now: float) -> list[str]:
    """Take the worker's accepted submissions that no training step holds out of training (their tasks re-open,
    each is marked rejected with ``reason``), and have its pending submissions recomputed whole. Returns the
    voided submission ids."""
    in_steps = select(step_submissions.c.submission_id)
    untrained = conn.execute(
        select(accepted_groups.c.submission_id, accepted_groups.c.task_id)
        .join(submissions, submissions.c.submission_id == accepted_groups.c.submission_id)
        .where(submissions.c.node_id == node_id, accepted_groups.c.submission_id.not_in(in_steps))
    ).all()
    _void(conn, [(row.submission_id, row.task_id) for row in untrained], reason, now)
    conn.execute(
        update(submissions)
        .where(submissions.c.node_id == node_id, submissions.c.status == "pending")
        .values(audit_share=1.0)
    )
    return [row.submission_id for row in untrained]


def void_submissions(conn: Connection, submission_ids: list[str], reason: str, now: float) -> None:
    """Take these accepted submissions (out of any training step already: the caller's) out of training: each is
    marked rejected with ``reason`` and its task re-opens."""
    rows = conn.execute(
        select(accepted_groups.c.submission_id, accepted_groups.c.task_id).where(
            accepted_groups.c.submission_id.in_(submission_ids)
        )
    ).all()
    _void(conn, [(row.submission_id, row.task_id) for row in rows], reason, now)


def _void(conn: Connection, accepted: list[tuple[str, str]], reason: str, now: float) -> None:
    """Void each (submission id, task id) of ``accepted``."""
    verdict_json = Verdict(submission_id="-", accepted=False, reasons=[reason[:512]])
    for submission_id, task_id in accepted:
        conn.execute(delete(accepted_groups).where(accepted_groups.c.submission_id == submission_id))
        final = verdict_json.model_copy(update={"submission_id": submission_id}).model_dump_json()
        conn.execute(
            update(submissions)
            .where(submissions.c.submission_id == submission_id)
            .values(status="rejected", verdict_at=now, verdict_json=final)
        )
        conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(state="open"))
        conn.execute(
            update(reaudits)
            .where(reaudits.c.submission_id == submission_id, reaudits.c.state == "pending")
            .values(state="voided", decided_at=now)
        )
