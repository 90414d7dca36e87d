"""Closing a pending submission without judging its worker: the environment failed, or its policy version is gone.

Two outcomes end a submission that nobody can audit, and neither is the worker's doing, so
neither counts for or against it (its ``num_accepted`` and ``num_rejected`` stay, nothing enters
``accepted_groups``, and once closed it no longer counts toward the lease room):

- ``environment_error``: ``validation.validators_per_submission`` validators reported that the run's
  environment could not score the rollouts (the reward raised, or returned NaN, inf or a non-number).
  The task is *dropped* (state ``dropped``): environments are checked to be deterministic at
  start-up, so the same example would very likely fail again, and re-issuing it would spend a
  worker's compute on a group that can never be scored.
- ``expired``: the submission was still pending when its policy version fell out of what the origin
  keeps (``policy.keep_versions``, at least async_level + 1). No validator can fetch that version to
  recompute it any more, so it is never handed out again; its task is re-opened (re-issued at the
  current version).

Each is recorded as the submission's status, a ``void`` event naming the reason (for the operator, on
``/v1/events`` and the dashboard), and counted in ``/v1/stats``
(``num_submissions_environment_error``, ``num_submissions_expired``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy import Connection, Row, select, update

from coordinator.ledger.storage.tables import reaudits, submissions, tasks
from protocol.schemas import Verdict

VoidStatus = Literal["environment_error", "expired"]
TASK_STATE_AFTER: dict[VoidStatus, str] = {"environment_error": "dropped", "expired": "open"}
"""What happens to the task of a closed submission (see the module docstring)."""

EventWriter = Callable[..., None]
"""The ledger's ``_event(conn, kind, node_id, subject, **data)``."""


def oldest_kept_version(current_version: int, keep_versions: int) -> int:
    """The oldest policy version the origin still keeps once ``current_version`` is published."""
    return max(0, current_version - keep_versions + 1)


def version_gone_reason(version: int, keep_versions: int, current_version: int) -> str:
    return (
        f"ledger: policy v{version} is no longer kept by the origin (it keeps the newest {keep_versions}, the "
        f"current is v{current_version}), so no validator can recompute this submission; not the worker's fault, "
        "the task is re-issued"
    )


def close_submission(
    conn: Connection,
    sub: Row[Any],
    status: VoidStatus,
    reasons: list[str],
    now: float,
    event: EventWriter,
    decided_by: str | None = None,
    validators: tuple[str, ...] = (),
) -> None:
    """Record ``status`` for the pending submission ``sub`` (its row locked by the caller), with the task rule."""
    final = Verdict(
        submission_id=sub.submission_id,
        accepted=False,
        reasons=reasons[:64],
        environment_error=reasons[0] if status == "environment_error" and reasons else None,
    )
    conn.execute(
        update(submissions)
        .where(submissions.c.submission_id == sub.submission_id)
        .values(status=status, verdict_by=decided_by, verdict_at=now, verdict_json=final.model_dump_json())
    )
    task_state = TASK_STATE_AFTER[status]
    conn.execute(update(tasks).where(tasks.c.task_id == sub.task_id).values(state=task_state))
    event(
        conn,
        "void",
        decided_by,
        sub.submission_id,
        status=status,
        worker_id=sub.node_id,
        task_id=sub.task_id,
        task_state=task_state,
        policy_version=sub.policy_version,
        reasons=final.reasons,
        validators=list(validators),
    )


def expire_unauditable(
    conn: Connection, current_version: int, keep_versions: int, now: float, event: EventWriter
) -> list[str]:
    """Close every pending submission whose policy version the origin no longer keeps; their ids."""
    oldest = oldest_kept_version(current_version, keep_versions)
    rows = conn.execute(
        select(submissions)
        .where(submissions.c.status == "pending", submissions.c.policy_version < oldest)
        .with_for_update()
    ).all()
    for sub in rows:
        reason = version_gone_reason(sub.policy_version, keep_versions, current_version)
        close_submission(conn, sub, "expired", [reason], now, event)
    # Re-audits of versions no validator can fetch any more lapse (their submissions stay accepted).
    lapsed = (
        conn.execute(
            select(reaudits.c.submission_id)
            .join(submissions, submissions.c.submission_id == reaudits.c.submission_id)
            .where(reaudits.c.state == "pending", submissions.c.policy_version < oldest)
        )
        .scalars()
        .all()
    )
    if lapsed:
        conn.execute(
            update(reaudits).where(reaudits.c.submission_id.in_(lapsed)).values(state="lapsed", decided_at=now)
        )
    return [sub.submission_id for sub in rows]
