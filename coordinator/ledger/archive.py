"""The ledger archive: old submission bodies and events moved out of the hot database into Parquet files.

The ledger keeps every submission and every event. What grows with the run is a submission's
body (tokens, logprobs, TOPLOC proofs: kilobytes per sample) and the event log.
:func:`archive_ledger` (``prime-coordinator archive``) writes the bodies of decided submissions
that no step can use any more (``archive.keep_versions``) and the events older than
``archive.keep_events_s`` to ``<archive dir>/submissions-<n>.parquet`` and ``events-<n>.parquet``,
each file whole (a temporary name, fsync, rename) before its rows change in the database. An
archived submission keeps its row, status, verdict and ``body_sha256``; its ``body_json`` becomes
the empty string (no body is ever empty otherwise). Archived events leave the table, in the one
transaction that lifts and restores its append-only guard. A crash between the file and the
database change leaves rows in both; the next run archives them again, so readers
(:func:`archived_bodies`, :func:`archived_events`) take the first copy of each and check each
body against its hash. Any Parquet reader (pyarrow, pandas, DuckDB) reads the files too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Column, Float, Integer, Text, delete, func, select, update

from coordinator.config import CoordinatorConfig
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.migrations import events_guard, migrate
from coordinator.ledger.storage.tables import events, run_state, step_submissions, submissions, train_steps

log = logging.getLogger("coordinator.ledger.archive")

ArchiveKind = Literal["submissions", "events"]
ARCHIVED_BODY = ""
"""``submissions.body_json`` of a submission whose body is in the archive."""
_FILE_NAME = re.compile(r"^(submissions|events)-(\d{6,})\.parquet$")
_UPDATE_CHUNK = 500


@dataclass
class ArchiveReport:
    submissions: int = 0
    events: int = 0
    files: list[Path] = field(default_factory=list)


def _arrow_type(column: Column[Any]) -> pa.DataType:
    if isinstance(column.type, Text):
        return pa.string()
    if isinstance(column.type, Float):
        return pa.float64()
    if isinstance(column.type, Integer):  # BigInteger too
        return pa.int64()
    return pa.bool_()


def _schema(columns: Iterable[Column[Any]]) -> pa.Schema:
    return pa.schema([pa.field(c.name, _arrow_type(c), nullable=bool(c.nullable)) for c in columns])


SUBMISSIONS_SCHEMA = _schema(submissions.columns)
EVENTS_SCHEMA = _schema(events.columns)


def archive_files(directory: Path, kind: ArchiveKind) -> list[Path]:
    """The archive files of ``kind``, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(2)), p) for p in directory.iterdir() if (m := _FILE_NAME.match(p.name)) and m[1] == kind]
    return [p for _, p in sorted(found)]


def _write_file(directory: Path, kind: ArchiveKind, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    existing = archive_files(directory, kind)
    number = 1 + max((int(_FILE_NAME.match(p.name)[2]) for p in existing), default=0)  # type: ignore[index]
    target = directory / f"{kind}-{number:06d}.parquet"
    tmp = directory / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp, compression="zstd")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return target


def archive_cutoffs(db: Database, config: CoordinatorConfig) -> tuple[int, int]:
    """(policy version below which decided submissions are archived, last step whose submissions may be)."""
    with db.read() as conn:
        current = conn.execute(select(run_state.c.current_policy_version)).scalar() or 0
        published = conn.execute(select(func.max(train_steps.c.step)).where(train_steps.c.state == "published"))
        last_published = published.scalar() or 0
    keep = config.archive.keep_versions
    return current - keep - config.scheduling.async_level, last_published - keep


def archive_ledger(db: Database, config: CoordinatorConfig, now: float) -> ArchiveReport:
    """Move what ``config.archive`` calls old out of the database into ``config.archive_dir``."""
    directory = config.archive_dir
    report = ArchiveReport()
    version_cutoff, step_cutoff = archive_cutoffs(db, config)
    recent_steps = select(step_submissions.c.submission_id).where(step_submissions.c.step > step_cutoff)
    while True:
        with db.read() as conn:
            rows = conn.execute(
                select(submissions)
                .where(
                    submissions.c.status.in_(("accepted", "rejected", "environment_error", "expired")),
                    submissions.c.body_json != ARCHIVED_BODY,
                    submissions.c.policy_version < version_cutoff,
                    submissions.c.submission_id.not_in(recent_steps),
                )
                .order_by(submissions.c.submitted_at, submissions.c.submission_id)
                .limit(config.archive.rows_per_file)
            ).all()
        if not rows:
            break
        report.files.append(_write_file(directory, "submissions", [r._asdict() for r in rows], SUBMISSIONS_SCHEMA))
        ids = [r.submission_id for r in rows]
        with db.write() as conn:
            for start in range(0, len(ids), _UPDATE_CHUNK):
                conn.execute(
                    update(submissions)
                    .where(submissions.c.submission_id.in_(ids[start : start + _UPDATE_CHUNK]))
                    .values(body_json=ARCHIVED_BODY)
                )
        report.submissions += len(rows)
    lift, restore = events_guard(db.engine.dialect.name)
    before = now - config.archive.keep_events_s
    while True:
        with db.read() as conn:
            rows = conn.execute(
                select(events)
                .where(events.c.at < before)
                .order_by(events.c.event_id)
                .limit(config.archive.rows_per_file)
            ).all()
        if not rows:
            break
        report.files.append(_write_file(directory, "events", [r._asdict() for r in rows], EVENTS_SCHEMA))
        with db.write() as conn:
            for statement in lift:
                conn.exec_driver_sql(statement)
            conn.execute(delete(events).where(events.c.event_id <= rows[-1].event_id, events.c.at < before))
            for statement in restore:
                conn.exec_driver_sql(statement)
        report.events += len(rows)
    log.info(
        "archived %d submission bodies and %d events into %d file(s) in %s",
        report.submissions,
        report.events,
        len(report.files),
        directory,
    )
    return report


def archived_bodies(directory: Path, submission_ids: Iterable[str]) -> dict[str, str]:
    """The archived bodies of ``submission_ids`` (those found, each checked against its recorded hash)."""
    wanted = set(submission_ids)
    found: dict[str, str] = {}
    for path in archive_files(directory, "submissions"):
        if not wanted - found.keys():
            break
        table = pq.read_table(
            path,
            columns=["submission_id", "body_sha256", "body_json"],
            filters=[("submission_id", "in", sorted(wanted - found.keys()))],
        )
        for row in table.to_pylist():
            body: str = row["body_json"]
            if hashlib.sha256(body.encode()).hexdigest() != row["body_sha256"]:
                raise ValueError(f"{path}: the archived body of {row['submission_id']} does not match its hash")
            found.setdefault(row["submission_id"], body)
    return found


def archived_events(directory: Path) -> Iterator[dict[str, Any]]:
    """Every archived event, in event order, each once."""
    last = 0
    for path in archive_files(directory, "events"):
        for row in pq.read_table(path).to_pylist():
            if row["event_id"] > last:
                last = row["event_id"]
                yield row


def vacuum(db: Database) -> None:
    """SQLite: give the pages the archived rows left back to the filesystem (PostgreSQL's autovacuum reuses them)."""
    if db.engine.dialect.name != "sqlite":
        return
    raw = db.engine.raw_connection()
    try:
        raw.cursor().execute("VACUUM")
    finally:
        raw.close()


def archive_from_cli(config: CoordinatorConfig, compact: bool) -> None:
    """`prime-coordinator archive`: archive what ``config.archive`` calls old, print what moved."""
    import time

    db = open_existing(config)
    try:
        report = archive_ledger(db, config, time.time())
        if compact:
            vacuum(db)
    finally:
        db.dispose()
    print(
        f"archived {report.submissions} submission bodies and {report.events} events "
        f"into {len(report.files)} file(s) in {config.archive_dir}"
    )


def open_existing(config: CoordinatorConfig) -> Database:
    """The run's ledger database, migrated to the current schema; a one-line error when there is none."""
    from protocol.errors import ConfigError

    if not config.ledger.url and not (config.data_dir / "ledger.db").is_file():
        raise ConfigError(f"no ledger at {config.data_dir / 'ledger.db'}: pass the run's config (-c) or --data-dir")
    db = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
    try:
        migrate(db)
    except BaseException:
        db.dispose()
        raise
    return db
