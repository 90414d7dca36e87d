"""The operator's word on validators, given on a live run: approve or revoke a node id, no restart.

``trust.approved_validators`` (the config) is the run's starting list. ``prime-coordinator validators
approve|revoke ID`` writes a decision into the ledger (``validator_approvals``) that overrides the config
for that id, and updates the node's row at once when it is registered: a revoked validator's next call is
refused, an approved one is admitted on its next registration. Each decision is an event. The running
coordinator reads nothing from the command: both meet in the ledger, on SQLite or PostgreSQL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, update

from coordinator.config import CoordinatorConfig
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import events, nodes, validator_approvals
from protocol.errors import IdentityError
from protocol.identity import public_key_from_node_id


@dataclass(frozen=True)
class ValidatorStanding:
    """One validator as the run sees it: approved or not, and by what."""

    node_id: str
    approved: bool
    source: str
    """``config`` (trust.approved_validators), ``ledger`` (a decision on the live run) or ``registered``."""
    registered: bool


def operator_approves(conn: Connection, node_id: str, configured: Iterable[str]) -> bool:
    """Whether the operator approves validator ``node_id``: a live decision, else the config's list."""
    decided = conn.execute(
        select(validator_approvals.c.approved).where(validator_approvals.c.node_id == node_id)
    ).scalar()
    return bool(decided) if decided is not None else node_id in set(configured)


def decide_validator(database: Database, node_id: str, approved: bool, note: str = "") -> bool:
    """Approve or revoke ``node_id`` on the live run; True when it is registered (the change applies at once)."""
    try:
        public_key_from_node_id(node_id)
    except IdentityError as exc:
        raise IdentityError(f"{exc.message}; give the id `prime-validator keys show --id-only` prints") from exc
    now = time.time()
    with database.write() as conn:
        conn.execute(delete(validator_approvals).where(validator_approvals.c.node_id == node_id))
        conn.execute(insert(validator_approvals).values(node_id=node_id, approved=approved, changed_at=now, note=note))
        changed = conn.execute(
            update(nodes).where(nodes.c.node_id == node_id, nodes.c.role == "validator").values(approved=approved)
        ).rowcount
        kind = "approve" if approved else "revoke"
        data = json.dumps({"note": note, "registered": bool(changed)})
        conn.execute(insert(events).values(at=now, kind=kind, node_id=None, subject=node_id, data_json=data))
    return bool(changed)


def validator_standings(database: Database, configured: Iterable[str]) -> list[ValidatorStanding]:
    """Every validator the run knows of: in the config, decided on the live run, or registered."""
    with database.read() as conn:
        decided = {row.node_id: bool(row.approved) for row in conn.execute(select(validator_approvals)).all()}
        registered = {
            row.node_id: bool(row.approved)
            for row in conn.execute(select(nodes.c.node_id, nodes.c.approved).where(nodes.c.role == "validator"))
        }
    listed = set(configured)
    standings = []
    for node_id in sorted(listed | set(decided) | set(registered)):
        if node_id in decided:
            approved, source = decided[node_id], "ledger"
        elif node_id in listed:
            approved, source = True, "config"
        else:
            approved, source = registered[node_id], "registered"
        standings.append(ValidatorStanding(node_id, approved, source, node_id in registered))
    return standings


def validators_from_cli(config: CoordinatorConfig, node_id: str | None, approved: bool | None) -> None:
    """`prime-coordinator validators approve|revoke|list` against the run's ledger (safe while it runs)."""
    from coordinator.ledger.archive import open_existing

    database = open_existing(config)
    try:
        if node_id is not None and approved is not None:
            registered = decide_validator(database, node_id, approved)
            verb = "approved" if approved else "revoked"
            when = "now" if registered else "when it registers"
            print(f"validator {node_id} {verb} on run {config.run_name!r} (takes effect {when})")
            return
        for standing in validator_standings(database, config.trust.approved_validators):
            state = "approved" if standing.approved else "not approved"
            seen = "registered" if standing.registered else "not registered yet"
            print(f"{standing.node_id}  {state} ({standing.source}), {seen}")
    finally:
        database.dispose()
