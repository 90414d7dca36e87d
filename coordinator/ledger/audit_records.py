"""Each worker's audit record and credit, as the ledger keeps them (tables ``audit_records`` and ``nodes``).

A record counts a worker's submissions accepted in a row for one (engine, software version): what
:func:`coordinator.ledger.audit_policy.audit_share` turns into the share of its next submission's
samples to recompute. Its credit is the verified work it has done (samples and tokens of accepted
submissions); a rejected submission, work the proofs caught, starts the record over and loses the
credit (kept as ``credit_lost_*``). Environment errors change neither.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from coordinator.ledger.storage.tables import audit_records, nodes

_KEY = ("node_id", "engine", "software_version")


def accepted_in_a_row(conn: Connection, node_id: str, engine: str, software_version: str) -> int:
    """The worker's record for this engine and software version (0 when it has none)."""
    found = conn.execute(
        select(audit_records.c.accepted_in_a_row).where(
            audit_records.c.node_id == node_id,
            audit_records.c.engine == engine,
            audit_records.c.software_version == software_version,
        )
    ).scalar()
    return int(found or 0)


def work_of(body: dict[str, Any]) -> tuple[int, int]:
    """(samples, completion tokens) of a stored submission body: the credit its acceptance earns."""
    rollouts: list[dict[str, Any]] = body.get("rollouts", [])
    tokens = 0
    for rollout in rollouts:
        tokens += len(rollout.get("completion_ids", []))
        tokens += sum(len(turn.get("completion_ids", [])) for turn in rollout.get("later_turns", []))
    return len(rollouts), tokens


def count_decision(
    conn: Connection, body: dict[str, Any], worker: Any, accepted: bool, also: dict[str, Any] | None = None
) -> None:
    """A decided submission (its stored body, parsed) in its worker's record and credit: one more accepted in a row
    and its work credited, or the record started over and the credit lost. ``also``: more of the worker's columns
    to set in the same update."""
    engine = str(body.get("engine", ""))
    key = {"node_id": worker.node_id, "engine": engine, "software_version": worker.software_version}
    column = audit_records.c.accepted_in_a_row
    insert = sqlite_insert if conn.dialect.name == "sqlite" else postgresql_insert
    statement = insert(audit_records).values(**key, accepted_in_a_row=1 if accepted else 0)
    conn.execute(
        statement.on_conflict_do_update(index_elements=list(_KEY), set_={column.name: column + 1 if accepted else 0})
    )
    node = nodes.c
    if accepted:
        samples, tokens = work_of(body)
        values: dict[str, Any] = {
            "credit_samples": node.credit_samples + samples,
            "credit_tokens": node.credit_tokens + tokens,
        }
    else:
        values = {
            "credit_lost_samples": node.credit_lost_samples + node.credit_samples,
            "credit_lost_tokens": node.credit_lost_tokens + node.credit_tokens,
            "credit_samples": 0,
            "credit_tokens": 0,
        }
    conn.execute(update(nodes).where(node.node_id == worker.node_id).values(**values, **(also or {})))
