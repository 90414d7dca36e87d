"""Versioned schema migrations: an upgraded coordinator opens a ledger written by an older one.

The schema's version is the highest row of ``schema_version``. :func:`migrate` applies every
later step in order, each in its own transaction with its version row, so a crash between
steps leaves a database at a consistent version that the next start carries on from. Steps
are plain DDL, written once and never edited (a change is a new step); ``{id}``, ``{float}``
and ``{bool}`` stand for the dialect's spelling. A database newer than this code is refused
rather than misread.

- v1: run state, nodes, tasks, leases, submissions, accepted groups, policy versions, events.
- v2: the durable replay cache (``nonces``), lease expiry index, and triggers that make
  ``events`` append-only.
- v3: PostgreSQL only: a sequence for prompt-group indices (carried on from run_state), so
  concurrent leases need no run-wide row lock. Nothing changes on SQLite.
- v4: ``verdict_votes``: each validator's verdict on a submission, kept apart so that
  ``validation.validators_per_submission`` of them must agree before the submission is decided.
- v5: the orchestrator's training steps (``train_steps``) and which accepted submission went
  into which step (``step_submissions``, keyed by submission so none is used twice).
- v6: each lease records the source it counts against and whether its node was on probation
  (``leases.source``, ``leases.probation``), so per-source fair share and probation budgets are
  index counts (:mod:`coordinator.ledger.sources`).
- v7: what the ledger handed to which validator and until when (``hand_outs``: only those verdicts
  count), each validator's record against the decisions (``nodes.num_votes_agreed``,
  ``nodes.num_votes_outvoted``), leases ended unsubmitted per node (``nodes.num_forfeited``), why a
  lease ended (``leases.end_reason``), and an index to find a task's earlier leases by node.
- v8: the operator's decisions on validators made on a live run (``validator_approvals``: approved or
  revoked, overriding ``trust.approved_validators``).
- v9: adaptive audit: each worker's record per engine and software version (``audit_records``), the
  share of each submission's samples to recompute, fixed when it is stored (``submissions.audit_share``),
  and each node's credit: verified samples and tokens, and what cheating made it lose
  (``nodes.credit_samples``, ``credit_tokens``, ``credit_lost_samples``, ``credit_lost_tokens``), and
  the accepted submissions audited again on their unchecked samples (``reaudits``).
- v10: the coordinator's signed run spec and the settings every API process of the run must share
  (``run_state.run_spec_json``, ``run_state.api_settings_json``), which API replicas start from, and
  the API processes serving the ledger, each with its last heartbeat (``api_processes``).
- v11: the training-safety contract: what each step did (``train_steps.kind``: trained, skipped or restored
  from an earlier version, ``restore_version``), the attempts a breaker refused (``attempt``, ``trips_json``),
  the steps a rollback undid (``rolled_back``), the accepted submissions set aside for carrying no reward
  spread (``no_signal_groups``), each prompt's run of answers without spread and its rest
  (``prompt_signal``), a rollback asked for and not yet done (``run_state.rollback_json``), and the oldest version
  whose rollouts may still be trained after a rollback (``run_state.version_floor``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import Connection, inspect, select

from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import schema_version
from protocol.errors import ConfigError

_V1 = [
    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at {float} NOT NULL)",
    """CREATE TABLE run_state (
        id INTEGER PRIMARY KEY, run_name TEXT NOT NULL, secret_hex TEXT NOT NULL,
        current_policy_version INTEGER NOT NULL, next_group_index BIGINT NOT NULL, created_at {float} NOT NULL)""",
    """CREATE TABLE nodes (
        node_id TEXT PRIMARY KEY, role TEXT NOT NULL, approved {bool} NOT NULL, registered_at {float} NOT NULL,
        last_seen {float} NOT NULL, ip TEXT NOT NULL, hardware_json TEXT NOT NULL, engine TEXT,
        software_version TEXT NOT NULL, versions_held_json TEXT NOT NULL, tokens_per_s {float} NOT NULL,
        num_accepted INTEGER NOT NULL, num_rejected INTEGER NOT NULL, banned {bool} NOT NULL, ban_reason TEXT)""",
    """CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY, group_index BIGINT NOT NULL UNIQUE, task_name TEXT NOT NULL,
        prompts_json TEXT NOT NULL, state TEXT NOT NULL, num_leases INTEGER NOT NULL, created_at {float} NOT NULL)""",
    "CREATE INDEX tasks_state ON tasks (state, group_index)",
    """CREATE TABLE leases (
        lease_id TEXT PRIMARY KEY, task_id TEXT NOT NULL REFERENCES tasks (task_id), node_id TEXT NOT NULL,
        policy_version INTEGER NOT NULL, sampling_seed BIGINT NOT NULL, group_size INTEGER NOT NULL,
        sampling_json TEXT NOT NULL, issued_at {float} NOT NULL, deadline {float} NOT NULL, state TEXT NOT NULL)""",
    "CREATE INDEX leases_node ON leases (node_id, state)",
    """CREATE TABLE submissions (
        submission_id TEXT PRIMARY KEY, lease_id TEXT NOT NULL UNIQUE REFERENCES leases (lease_id),
        task_id TEXT NOT NULL REFERENCES tasks (task_id), node_id TEXT NOT NULL, policy_version INTEGER NOT NULL,
        body_sha256 TEXT NOT NULL, body_json TEXT NOT NULL, worker_signature TEXT NOT NULL,
        submitted_at {float} NOT NULL, status TEXT NOT NULL, verdict_by TEXT, verdict_at {float}, verdict_json TEXT)""",
    "CREATE INDEX submissions_status ON submissions (status, submitted_at)",
    """CREATE TABLE accepted_groups (
        task_id TEXT PRIMARY KEY REFERENCES tasks (task_id),
        submission_id TEXT NOT NULL REFERENCES submissions (submission_id), accepted_at {float} NOT NULL)""",
    """CREATE TABLE policy_versions (
        version INTEGER PRIMARY KEY, manifest_json TEXT NOT NULL, signer TEXT NOT NULL, signature TEXT NOT NULL,
        published_at {float} NOT NULL)""",
    """CREATE TABLE events (
        event_id {id}, at {float} NOT NULL, kind TEXT NOT NULL, node_id TEXT, subject TEXT,
        data_json TEXT NOT NULL)""",
]

_V2_COMMON = [
    """CREATE TABLE nonces (
        node_id TEXT NOT NULL, nonce TEXT NOT NULL, expires_at {float} NOT NULL, PRIMARY KEY (node_id, nonce))""",
    "CREATE INDEX nonces_expiry ON nonces (expires_at)",
    "CREATE INDEX leases_expiry ON leases (state, deadline)",
]
_V2_SQLITE = [
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
]
_V2_POSTGRESQL = [
    """CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'events are append-only'; END $$""",
    "CREATE TRIGGER events_no_change BEFORE UPDATE OR DELETE ON events "
    "FOR EACH ROW EXECUTE FUNCTION events_append_only()",
]

_V3_POSTGRESQL = [
    "CREATE SEQUENCE group_index_seq MINVALUE 0 START 0",
    "SELECT setval('group_index_seq', COALESCE((SELECT next_group_index FROM run_state WHERE id = 1), 0), false)",
]

_V4 = [
    """CREATE TABLE verdict_votes (
        submission_id TEXT NOT NULL REFERENCES submissions (submission_id), validator_id TEXT NOT NULL,
        accepted {bool} NOT NULL, verdict_json TEXT NOT NULL, posted_at {float} NOT NULL,
        PRIMARY KEY (submission_id, validator_id))""",
    "CREATE INDEX verdict_votes_validator ON verdict_votes (validator_id, submission_id)",
]

_V5 = [
    """CREATE TABLE train_steps (
        step INTEGER PRIMARY KEY, state TEXT NOT NULL, min_policy_version INTEGER NOT NULL,
        recorded_at {float} NOT NULL, trained_at {float}, published_at {float}, metrics_json TEXT)""",
    """CREATE TABLE step_submissions (
        submission_id TEXT PRIMARY KEY REFERENCES submissions (submission_id),
        step INTEGER NOT NULL REFERENCES train_steps (step), position INTEGER NOT NULL)""",
    "CREATE INDEX step_submissions_step ON step_submissions (step, position)",
]

_V6 = [
    "ALTER TABLE leases ADD COLUMN source TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE leases ADD COLUMN probation {bool} NOT NULL DEFAULT FALSE",
    "CREATE INDEX leases_source ON leases (source, state)",
]

_V7 = [
    """CREATE TABLE hand_outs (
        submission_id TEXT NOT NULL REFERENCES submissions (submission_id), validator_id TEXT NOT NULL,
        handed_at {float} NOT NULL, expires_at {float} NOT NULL, PRIMARY KEY (submission_id, validator_id))""",
    "ALTER TABLE nodes ADD COLUMN num_votes_agreed INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN num_votes_outvoted INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN num_forfeited INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE leases ADD COLUMN end_reason TEXT",
    "CREATE INDEX leases_task ON leases (task_id, node_id)",
]

_V8 = [
    """CREATE TABLE validator_approvals (
        node_id TEXT PRIMARY KEY, approved {bool} NOT NULL, changed_at {float} NOT NULL, note TEXT NOT NULL)""",
]

_V9 = [
    """CREATE TABLE audit_records (
        node_id TEXT NOT NULL, engine TEXT NOT NULL, software_version TEXT NOT NULL,
        accepted_in_a_row INTEGER NOT NULL, PRIMARY KEY (node_id, engine, software_version))""",
    "ALTER TABLE submissions ADD COLUMN audit_share {float}",
    "ALTER TABLE nodes ADD COLUMN credit_samples BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN credit_tokens BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN credit_lost_samples BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN credit_lost_tokens BIGINT NOT NULL DEFAULT 0",
    """CREATE TABLE reaudits (
        submission_id TEXT PRIMARY KEY REFERENCES submissions (submission_id), node_id TEXT NOT NULL,
        positions_json TEXT NOT NULL, state TEXT NOT NULL, votes_json TEXT NOT NULL, created_at {float} NOT NULL,
        decided_at {float})""",
    "CREATE INDEX reaudits_state ON reaudits (state, created_at)",
]

_V10 = [
    "ALTER TABLE run_state ADD COLUMN run_spec_json TEXT",
    "ALTER TABLE run_state ADD COLUMN api_settings_json TEXT",
    """CREATE TABLE api_processes (
        process_id TEXT PRIMARY KEY, host TEXT NOT NULL, started_at {float} NOT NULL, last_seen {float} NOT NULL)""",
]

_V11 = [
    "ALTER TABLE train_steps ADD COLUMN kind TEXT NOT NULL DEFAULT 'train'",
    "ALTER TABLE train_steps ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE train_steps ADD COLUMN restore_version INTEGER",
    "ALTER TABLE train_steps ADD COLUMN rolled_back {bool} NOT NULL DEFAULT FALSE",
    "ALTER TABLE train_steps ADD COLUMN trips_json TEXT",
    """CREATE TABLE no_signal_groups (
        submission_id TEXT PRIMARY KEY REFERENCES submissions (submission_id), step INTEGER NOT NULL,
        set_aside_at {float} NOT NULL)""",
    "CREATE INDEX no_signal_groups_step ON no_signal_groups (step)",
    """CREATE TABLE prompt_signal (
        prompt_key TEXT PRIMARY KEY, no_signal_in_a_row INTEGER NOT NULL, resting_until BIGINT NOT NULL)""",
    "ALTER TABLE run_state ADD COLUMN rollback_json TEXT",
    "ALTER TABLE run_state ADD COLUMN version_floor INTEGER NOT NULL DEFAULT 0",
]

_SPELLING = {
    "sqlite": {"id": "INTEGER PRIMARY KEY AUTOINCREMENT", "float": "REAL", "bool": "BOOLEAN"},
    "postgresql": {"id": "BIGSERIAL PRIMARY KEY", "float": "DOUBLE PRECISION", "bool": "BOOLEAN"},
}


def steps(dialect: str) -> list[Sequence[str]]:
    """The DDL of every migration step for ``dialect``; step i brings the schema to version i + 1."""
    v2_specific = _V2_SQLITE if dialect == "sqlite" else _V2_POSTGRESQL
    v3 = [] if dialect == "sqlite" else _V3_POSTGRESQL
    spelling = _SPELLING[dialect]
    all_steps = (_V1, _V2_COMMON + v2_specific, v3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11)
    return [[statement.format(**spelling) for statement in step] for step in all_steps]


LATEST_VERSION = 11


def events_guard(dialect: str) -> tuple[list[str], list[str]]:
    """The DDL that lifts, and the DDL that restores, the guard against deleting events (v2).

    Only the ledger archive uses it, both halves in the one transaction that deletes the events it
    has just written to an archive file, so no other transaction ever sees the guard missing.
    """
    if dialect == "sqlite":
        return ["DROP TRIGGER events_no_delete"], [_V2_SQLITE[1]]
    return ["DROP TRIGGER events_no_change ON events"], [_V2_POSTGRESQL[1]]


_MIGRATION_LOCK_ID = 7_253_001


def current_version(conn: Connection) -> int:
    """The schema version of the connected database (0 when empty)."""
    if not inspect(conn).has_table("schema_version"):
        return 0
    found = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version.desc())).first()
    return int(found[0]) if found else 0


def migrate(database: Database, target: int = LATEST_VERSION) -> int:
    """Bring the database up to ``target``; return the version it was at before."""
    dialect = database.engine.dialect.name
    with database.write() as conn:
        before = current_version(conn)
    if before > LATEST_VERSION:
        raise ConfigError(
            f"the ledger at {database.engine.url.render_as_string(hide_password=True)} has schema version "
            f"{before}, newer than this coordinator understands ({LATEST_VERSION}); upgrade prime-network"
        )
    for version in range(before + 1, target + 1):
        with database.write() as conn:
            if dialect == "postgresql":  # replicas starting together migrate one at a time
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_ID})")
            if current_version(conn) >= version:  # another replica got there first
                continue
            for statement in steps(dialect)[version - 1]:
                conn.exec_driver_sql(statement)
            conn.execute(schema_version.insert().values(version=version, applied_at=time.time()))
    return before
