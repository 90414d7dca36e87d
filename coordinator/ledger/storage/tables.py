"""The ledger's tables as SQLAlchemy Core objects, matching the latest migration.

Queries are written against these; the DDL that creates them lives in
:mod:`coordinator.ledger.storage.migrations` (a test checks that the two agree). Times are Unix
seconds as floats; JSON payloads are stored as text exactly as they were validated. A
submission whose body was moved to the archive (:mod:`coordinator.ledger.archive`) has an empty
``body_json``; its ``body_sha256`` still identifies the archived body.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Float, Integer, MetaData, Table, Text

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", Float, nullable=False),
)

run_state = Table(
    "run_state",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_name", Text, nullable=False),
    Column("secret_hex", Text, nullable=False),
    Column("current_policy_version", Integer, nullable=False),
    Column("next_group_index", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("run_spec_json", Text),
    Column("api_settings_json", Text),
    Column("rollback_json", Text),
    Column("version_floor", Integer, nullable=False),
)

api_processes = Table(
    "api_processes",
    metadata,
    Column("process_id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
)

nodes = Table(
    "nodes",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("role", Text, nullable=False),
    Column("approved", Boolean, nullable=False),
    Column("registered_at", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    Column("ip", Text, nullable=False),
    Column("hardware_json", Text, nullable=False),
    Column("engine", Text),
    Column("software_version", Text, nullable=False),
    Column("versions_held_json", Text, nullable=False),
    Column("tokens_per_s", Float, nullable=False),
    Column("num_accepted", Integer, nullable=False),
    Column("num_rejected", Integer, nullable=False),
    Column("banned", Boolean, nullable=False),
    Column("ban_reason", Text),
    Column("num_votes_agreed", Integer, nullable=False),
    Column("num_votes_outvoted", Integer, nullable=False),
    Column("num_forfeited", Integer, nullable=False),
    Column("credit_samples", BigInteger, nullable=False),
    Column("credit_tokens", BigInteger, nullable=False),
    Column("credit_lost_samples", BigInteger, nullable=False),
    Column("credit_lost_tokens", BigInteger, nullable=False),
)

tasks = Table(
    "tasks",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("group_index", BigInteger, nullable=False, unique=True),
    Column("task_name", Text, nullable=False),
    Column("prompts_json", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("num_leases", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)

leases = Table(
    "leases",
    metadata,
    Column("lease_id", Text, primary_key=True),
    Column("task_id", Text, nullable=False),
    Column("node_id", Text, nullable=False),
    Column("policy_version", Integer, nullable=False),
    Column("sampling_seed", BigInteger, nullable=False),
    Column("group_size", Integer, nullable=False),
    Column("sampling_json", Text, nullable=False),
    Column("issued_at", Float, nullable=False),
    Column("deadline", Float, nullable=False),
    Column("state", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("probation", Boolean, nullable=False),
    Column("end_reason", Text),
)

submissions = Table(
    "submissions",
    metadata,
    Column("submission_id", Text, primary_key=True),
    Column("lease_id", Text, nullable=False, unique=True),
    Column("task_id", Text, nullable=False),
    Column("node_id", Text, nullable=False),
    Column("policy_version", Integer, nullable=False),
    Column("body_sha256", Text, nullable=False),
    Column("body_json", Text, nullable=False),
    Column("worker_signature", Text, nullable=False),
    Column("submitted_at", Float, nullable=False),
    Column("status", Text, nullable=False),
    Column("verdict_by", Text),
    Column("verdict_at", Float),
    Column("verdict_json", Text),
    Column("audit_share", Float),
)

reaudits = Table(
    "reaudits",
    metadata,
    Column("submission_id", Text, primary_key=True),
    Column("node_id", Text, nullable=False),
    Column("positions_json", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("votes_json", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("decided_at", Float),
)

audit_records = Table(
    "audit_records",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("engine", Text, primary_key=True),
    Column("software_version", Text, primary_key=True),
    Column("accepted_in_a_row", Integer, nullable=False),
)

verdict_votes = Table(
    "verdict_votes",
    metadata,
    Column("submission_id", Text, primary_key=True),
    Column("validator_id", Text, primary_key=True),
    Column("accepted", Boolean, nullable=False),
    Column("verdict_json", Text, nullable=False),
    Column("posted_at", Float, nullable=False),
)

accepted_groups = Table(
    "accepted_groups",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("submission_id", Text, nullable=False),
    Column("accepted_at", Float, nullable=False),
)

policy_versions = Table(
    "policy_versions",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("manifest_json", Text, nullable=False),
    Column("signer", Text, nullable=False),
    Column("signature", Text, nullable=False),
    Column("published_at", Float, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("event_id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("kind", Text, nullable=False),
    Column("node_id", Text),
    Column("subject", Text),
    Column("data_json", Text, nullable=False),
)

nonces = Table(
    "nonces",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("nonce", Text, primary_key=True),
    Column("expires_at", Float, nullable=False),
)

train_steps = Table(
    "train_steps",
    metadata,
    Column("step", Integer, primary_key=True),
    Column("state", Text, nullable=False),
    Column("min_policy_version", Integer, nullable=False),
    Column("recorded_at", Float, nullable=False),
    Column("trained_at", Float),
    Column("published_at", Float),
    Column("metrics_json", Text),
    Column("kind", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("restore_version", Integer),
    Column("rolled_back", Boolean, nullable=False),
    Column("trips_json", Text),
)

step_submissions = Table(
    "step_submissions",
    metadata,
    Column("submission_id", Text, primary_key=True),
    Column("step", Integer, nullable=False),
    Column("position", Integer, nullable=False),
)

no_signal_groups = Table(
    "no_signal_groups",
    metadata,
    Column("submission_id", Text, primary_key=True),
    Column("step", Integer, nullable=False),
    Column("set_aside_at", Float, nullable=False),
)

prompt_signal = Table(
    "prompt_signal",
    metadata,
    Column("prompt_key", Text, primary_key=True),
    Column("no_signal_in_a_row", Integer, nullable=False),
    Column("resting_until", BigInteger, nullable=False),
)

hand_outs = Table(
    "hand_outs",
    metadata,
    Column("submission_id", Text, primary_key=True),
    Column("validator_id", Text, primary_key=True),
    Column("handed_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)

validator_approvals = Table(
    "validator_approvals",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("approved", Boolean, nullable=False),
    Column("changed_at", Float, nullable=False),
    Column("note", Text, nullable=False),
)
