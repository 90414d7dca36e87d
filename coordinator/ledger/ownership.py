"""One run, one owner: a coordinator holds its ledger exclusively, and a ledger belongs to one coordinator key.

Two coordinators on one ledger (two data dirs, one ``ledger.url``) would lease the same tasks twice, run
two trainers and publish two chains of versions. :func:`hold_ledger` takes a lock on the ledger for the
process's life: on PostgreSQL a session advisory lock keyed by the database and schema (so tests in
schemas of their own never collide), on a connection whose ``application_name`` names the holder, which
a second coordinator reads back to say who holds the run; on SQLite an ``flock`` on a file beside the
database. :func:`check_owner` refuses a ledger whose published versions another key signed: a moved or
deleted data dir comes back with a new key, and resuming that run would publish versions no worker or
relay trusts. :func:`drop_ledger` is the start-over: every table, sequence and function the migrations
made, gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, MetaData, text
from sqlalchemy.exc import SQLAlchemyError

from coordinator.ledger.storage.engine import Database, ledger_scope
from coordinator.ledger.storage.tables import metadata
from protocol.errors import NotFoundError, StartupError
from runtime.data_dir_lock import DataDirLock, hold_lock_file

ROLE = "prime-coordinator"
START_OVER = "`prime-coordinator reset -c RUN.toml` deletes the run's ledger tables and data dir to start over"
POSTGRES_EXTRAS = ("DROP SEQUENCE IF EXISTS group_index_seq", "DROP FUNCTION IF EXISTS events_append_only()")


class LedgerLock:
    """The coordinator's hold on its ledger, released by :meth:`release` or the process's end."""

    def __init__(
        self, connection: Connection | None = None, key: int = 0, file_lock: DataDirLock | None = None
    ) -> None:
        self._connection = connection
        self._key = key
        self._file_lock = file_lock

    def release(self) -> None:
        if self._connection is not None:
            # Unlock before disconnecting: the server ends a closed session's backend (and frees its locks)
            # asynchronously, so a coordinator starting right after this one could still find the lock held.
            with contextlib.suppress(SQLAlchemyError):  # a lost connection has already dropped the lock
                self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self._key})
            self._connection.invalidate()  # closes the session for real (not back to the pool): the lock goes with it
            self._connection.close()
            self._connection = None
        if self._file_lock is not None:
            self._file_lock.release()
            self._file_lock = None

    def __enter__(self) -> LedgerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def shown_url(database: Database) -> str:
    return database.engine.url.render_as_string(hide_password=True)


def _advisory_key(connection: Connection) -> int:
    """A signed 64-bit key for the ledger's database and schema."""
    where = ledger_scope(connection)
    return int.from_bytes(hashlib.sha256(f"prime-network ledger {where}".encode()).digest()[:8], "big", signed=True)


def _postgres_holder(connection: Connection, key: int) -> str:
    high, low = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    row = connection.execute(
        text(
            "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.classid = CAST(:high AS oid) AND l.objid = CAST(:low AS oid)"
        ),
        {"high": high, "low": low},
    ).first()
    if row is None:
        return "another coordinator"
    name = row.application_name or "another coordinator"
    return f"{name} (connected from {row.client_addr or 'this host'} since {row.backend_start:%Y-%m-%d %H:%M:%S})"


def hold_ledger(database: Database) -> LedgerLock:
    """Lock the ledger for this coordinator; a StartupError naming the holder when another one runs the ledger."""
    fix = "stop that coordinator first; a run has one coordinator (API replicas share it through the load balancer)"
    if database.engine.dialect.name == "postgresql":
        connection = database.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            me = f"{ROLE} pid {os.getpid()} on {socket.gethostname()}"
            connection.execute(text("SELECT set_config('application_name', :name, false)"), {"name": me[:63]})
            key = _advisory_key(connection)
            if not connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar_one():
                holder = _postgres_holder(connection, key)
                raise StartupError(f"the ledger {shown_url(database)} is in use by {holder}", fix)
        except BaseException:
            connection.close()
            raise
        return LedgerLock(connection=connection, key=key)
    path = database.engine.url.database
    if not path or path == ":memory:":
        return LedgerLock()
    return LedgerLock(file_lock=hold_lock_file(Path(f"{path}.owner.lock"), ROLE, f"the ledger {path}", fix))


def check_owner(ledger: Any, node_id: str, data_dir: Path) -> None:
    """Refuse a ledger whose latest published version another coordinator key signed."""
    try:
        latest = ledger.manifest(None)
    except NotFoundError:
        return
    if latest.signer == node_id:
        return
    status = ledger.status()
    raise StartupError(
        f"the ledger {shown_url(ledger.db)} holds run {status.run_name!r} (policy v{latest.manifest.version}) "
        f"signed by coordinator {latest.signer}, not by the key in {data_dir} ({node_id})",
        f"to resume that run, start with the data dir that holds its key; {START_OVER}",
    )


def ledger_tables(database: Database) -> list[str]:
    """The ledger's tables present in the database (empty when there is no ledger), each before any table it
    references: the order in which they can be dropped. The order comes from the foreign keys the database holds
    (the migrations declare them, :data:`metadata` does not), so SQLite, which enforces them while a table is
    dropped, drops a ledger that has trained."""
    present = MetaData()
    present.reflect(bind=database.engine, only=lambda name, _: name in metadata.tables)
    return [table.name for table in reversed(present.sorted_tables)]


def drop_ledger(database: Database) -> list[str]:
    """Drop every table (and on PostgreSQL the sequence and function) of the ledger; the tables dropped."""
    dropped = ledger_tables(database)
    postgres = database.engine.dialect.name == "postgresql"
    with database.engine.begin() as connection:
        for name in dropped:
            connection.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"' + (" CASCADE" if postgres else ""))
        if postgres:
            for statement in POSTGRES_EXTRAS:
                connection.exec_driver_sql(statement)
    return dropped
