"""Trained data kept for people: the rollout export (Parquet, JSONL) and the ledger archive, read back.

On SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from coordinator.cli import app
from coordinator.ledger.archive import ARCHIVED_BODY, archive_ledger, archived_bodies, archived_events
from coordinator.ledger.batches import train_samples
from coordinator.ledger.export import export_rollouts, parse_steps
from coordinator.ledger.storage.tables import events, submissions
from protocol.errors import ConfigError
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest
from runtime.cli import EXIT_BAD_CONFIG, EXIT_FAILURE
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness
from tests.unit.coordinator.ledger.test_train_steps import judged

pytestmark = pytest.mark.anyio


async def trained_run(harness: LedgerHarness) -> tuple[LedgerClient, LedgerClient, dict[str, str]]:
    """Two published steps (2 + 1 groups), a rejected and a pending submission; returns the bodies by id."""
    worker, validator = await harness.worker(), await harness.validator()
    steps = harness.ledger.train_steps
    for _ in range(3):
        await judged(harness, worker, validator, reward=0.25)
    await judged(harness, worker, validator, accepted=False)
    (pending,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    await worker.submit(submission_for(pending))
    for step, groups in ((1, 2), (2, 1)):
        assert steps.record_batch(step, groups_per_step=groups, min_version=0) is not None
        steps.mark_trained(step, {"loss": 0.1})
        steps.mark_published(step)
    with harness.database.read() as conn:
        bodies = dict(conn.execute(select(submissions.c.submission_id, submissions.c.body_json)).all())
    return worker, validator, bodies


def read_export(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return list(pq.read_table(path).to_pylist())


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
async def test_export_round_trips_the_trained_rollouts_with_rewards(
    make_harness: MakeHarness, tmp_path: Path, fmt: str
) -> None:
    harness = make_harness()
    worker, validator, _ = await trained_run(harness)
    steps = harness.ledger.train_steps
    out = tmp_path / f"rollouts.{fmt}"
    count = export_rollouts(harness.database, "1:2", fmt, out, harness.config.archive_dir)  # type: ignore[arg-type]
    rows = read_export(out, fmt)
    assert count == len(rows) == 3 * 2 * 2  # 3 groups x 2 prompts x 2 samples
    # Exactly what the trainer learned from, step by step, in batch order.
    for step in (1, 2):
        groups = steps.groups(step)
        expected = train_samples(groups)
        got = [row for row in rows if row["step"] == step]
        assert [(r["prompt_ids"], r["completion_ids"], r["logprobs"], r["advantage"], r["reward"]) for r in got] == [
            (s.prompt_ids, s.completion_ids, s.inference_logprobs, s.advantage, s.reward) for s in expected
        ]
        assert [r["submission_id"] for r in got][:: 2 * 2] == [g.submission_id for g in groups]
        assert all(r["accepted"] and r["verdict_by"] and r["step_state"] == "published" for r in got)
    assert sorted({round(r["reward"], 6) for r in rows}) == [0.25, 0.35, 0.45, 0.55]
    # One step, an open range, and the refusals a person can act on.
    assert export_rollouts(harness.database, "2", fmt, out, harness.config.archive_dir) == 4  # type: ignore[arg-type]
    assert export_rollouts(harness.database, "2:", fmt, out, harness.config.archive_dir) == 4  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no recorded training step"):
        export_rollouts(harness.database, "3:9", fmt, out, harness.config.archive_dir)  # type: ignore[arg-type]
    assert read_export(out, fmt) and not list(tmp_path.glob(".*.tmp"))  # the last good export is left whole
    assert parse_steps("4:") == (4, -1) and parse_steps(":3") == (1, 3)
    for bad in ("x", "3:1", "0:2", "1:y"):
        with pytest.raises(ConfigError, match="--steps"):
            parse_steps(bad)
    await worker.aclose()
    await validator.aclose()


async def test_archive_moves_old_bodies_and_events_out_and_keeps_them_readable(
    make_harness: MakeHarness, tmp_path: Path
) -> None:
    harness = make_harness(scheduling__async_level=0, archive__keep_versions=1, archive__keep_events_s=100)
    worker, validator, bodies = await trained_run(harness)
    before_export = tmp_path / "before.parquet"
    export_rollouts(harness.database, "1:2", "parquet", before_export, harness.config.archive_dir)
    # Nothing is old enough yet: every submission was made with v0, the current version.
    report = archive_ledger(harness.database, harness.config, now=harness.clock() + 1)
    assert (report.submissions, report.events, report.files) == (0, 0, [])

    coordinator = harness.client(harness.coordinator)
    for version in (1, 2):
        await coordinator.publish(signed_manifest(harness.coordinator, version))
    harness.clock.advance(500)
    fresh = await judged(harness, worker, validator)  # made with v2, within keep_versions: stays
    all_events = harness.ledger.events(0, 10_000).events
    report = archive_ledger(harness.database, harness.config, now=harness.clock())
    with harness.database.read() as conn:
        rows = {r.submission_id: r for r in conn.execute(select(submissions)).all()}
        left = [e.event_id for e in conn.execute(select(events.c.event_id)).all()]
    archived = {sid for sid, r in rows.items() if r.body_json == ARCHIVED_BODY}
    decided_v0 = {sid for sid, r in rows.items() if r.status != "pending" and r.policy_version == 0}
    last_step = set(harness.ledger.train_steps.groups(2)[0].submission_id.split())  # within keep_versions steps
    # the v0 submission still pending when v2 was published was expired then (the origin keeps no v0): closed too
    assert archived == decided_v0 - last_step and len(archived) == 4 and report.submissions == 4
    assert all(rows[sid].status != "pending" for sid in archived) and fresh not in archived
    closed = ("accepted", "rejected", "expired")
    assert all(r.status in closed and r.verdict_json for sid, r in rows.items() if sid in archived)
    # Archived bodies read back byte for byte (and match the hash the ledger kept).
    found = archived_bodies(harness.config.archive_dir, archived)
    assert found == {sid: bodies[sid] for sid in archived}
    assert all(hashlib.sha256(body.encode()).hexdigest() == rows[sid].body_sha256 for sid, body in found.items())
    # Old events left the table for the archive, in order, none lost; recent ones stayed.
    old = [e for e in all_events if e.at < harness.clock() - 100]
    assert [e["event_id"] for e in archived_events(harness.config.archive_dir)] == [e.event_id for e in old]
    assert report.events == len(old) and left and min(left) > old[-1].event_id
    # Exports still work from the archive, identical to before.
    after_export = tmp_path / "after.parquet"
    export_rollouts(harness.database, "1:2", "parquet", after_export, harness.config.archive_dir)
    assert pq.read_table(after_export).to_pylist() == pq.read_table(before_export).to_pylist()
    # The event log is append-only again, and the ledger keeps working.
    with pytest.raises(DBAPIError, match="append-only"), harness.database.write() as conn:
        conn.execute(delete(events).where(events.c.event_id == left[0]))
    await judged(harness, worker, validator)
    again = archive_ledger(harness.database, harness.config, now=harness.clock())
    assert (again.submissions, again.events) == (0, 0)
    # A crash after a file was written but before the database changed: both copies read as one.
    (first_file,) = [p for p in report.files if p.name.startswith("submissions")]
    first_file.with_name("submissions-000099.parquet").write_bytes(first_file.read_bytes())
    assert archived_bodies(harness.config.archive_dir, archived) == found
    for client in (worker, validator, coordinator):
        await client.aclose()


async def test_export_and_archive_commands(make_harness: MakeHarness, tmp_path: Path) -> None:
    harness = make_harness()
    worker, validator, _ = await trained_run(harness)
    where = ["--data-dir", str(harness.config.data_dir), "--ledger-url", harness.config.ledger_url]
    out = tmp_path / "out" / "steps.jsonl"
    result = CliRunner().invoke(app, ["export", "--steps", "1:2", "--format", "jsonl", "--out", str(out), *where])
    assert result.exit_code == 0, result.output
    assert "exported 12 rollouts of steps 1:2" in result.output and len(out.read_text().splitlines()) == 12
    result = CliRunner().invoke(app, ["archive", "--set", "archive.keep_events_s=0", *where])
    assert result.exit_code == 0, result.output
    assert "archived 0 submission bodies and" in result.output and list(archived_events(harness.config.archive_dir))
    result = CliRunner().invoke(app, ["export", "--steps", "1:2", "--format", "csv", "--out", str(out), *where])
    assert result.exit_code == EXIT_FAILURE and "choose parquet or jsonl" in result.output
    nowhere = ["--data-dir", str(tmp_path / "no-run")]
    result = CliRunner().invoke(app, ["export", "--steps", "1", "--out", str(out), *nowhere])
    assert result.exit_code == EXIT_BAD_CONFIG and "no ledger at" in result.output
    assert not (tmp_path / "no-run" / "ledger.db").exists()
    await worker.aclose()
    await validator.aclose()
