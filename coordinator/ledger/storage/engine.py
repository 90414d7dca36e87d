"""Database engines for the ledger: a SQLite file in WAL mode by default, PostgreSQL by URL.

SQLite allows one writer at a time. Write transactions here begin with ``BEGIN IMMEDIATE``
(take the write lock up front, so two transactions never deadlock upgrading a read lock) and
are serialized inside the process by a lock, so threads queue in Python rather than spin in
SQLite's busy handler. Reads begin deferred and run concurrently (WAL). PostgreSQL gets a
connection pool; its write transactions lock the rows they change (``FOR UPDATE``).
SQLite's ``synchronous=NORMAL`` (the default here) already survives a killed process, which
is what acknowledged writes must survive; ``FULL`` adds power-cut safety at an fsync per commit.

The statements every request runs (nonce, node, lease, submission, event) are module constants
with bind parameters, built once and run with a dict of values: building a SQLAlchemy statement
costs more than running it (bench/ledger_load.py: 3.5 -> 2.0 ms of coordinator CPU per request).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url

_WRITE_OPTION = "prime_write"


def ledger_scope(connection: Connection) -> str:
    """``database.schema`` of a PostgreSQL connection: what names one ledger on its server (locks, channels)."""
    return str(connection.execute(text("SELECT current_database() || '.' || current_schema()")).scalar_one())


class Database:
    """An engine plus the two ways the ledger uses it: :meth:`write` and :meth:`read` transactions."""

    def __init__(self, url: str, sqlite_synchronous: str = "NORMAL", pool_size: int = 8) -> None:
        self.url = url
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self._write_lock = threading.Lock() if self.is_sqlite else None
        if self.is_sqlite:
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(
                url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=pool_size, max_overflow=8
            )
            self._install_sqlite_hooks(sqlite_synchronous)
        else:
            # No pre-ping (a round trip per transaction); recycle connections instead.
            self.engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=300)

    def _install_sqlite_hooks(self, synchronous: str) -> None:
        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Driver autocommit: SQLAlchemy's "begin" hook below emits BEGIN itself.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE_OPTION) else "BEGIN")

    @contextmanager
    def write(self, durable: bool = True) -> Iterator[Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises.

        ``durable=False`` is for soft state (nonces, heartbeats): on PostgreSQL its commit does not
        wait for the WAL flush, so a crash of the database server (not of the coordinator) may lose
        the last fraction of a second of it. Leases, submissions and verdicts are always durable.
        """
        if self._write_lock is None:
            with self.engine.begin() as conn:
                if not durable:
                    conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                yield conn
            return
        with self._write_lock, self.engine.connect() as conn:
            conn = conn.execution_options(**{_WRITE_OPTION: True})
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """One read-only transaction (a consistent snapshot)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()
