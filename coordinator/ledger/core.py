"""The ledger's core: its one run row, its write transactions, its event log and the calling node's row.

Every part of the ledger (:mod:`coordinator.ledger.leasing`, :mod:`~coordinator.ledger.validation`,
:mod:`~coordinator.ledger.submitting`, :mod:`~coordinator.ledger.publishing`, :mod:`~coordinator.ledger.train_steps`,
:mod:`~coordinator.ledger.views`) is built on one :class:`LedgerCore` and changes the database only through
:meth:`LedgerCore.write`: one transaction per request, which first claims the signed request's nonce and tells
the process's waiters (and, on PostgreSQL with :meth:`LedgerCore.share_changes`, the other processes on the
ledger) which event kinds it committed. :class:`coordinator.ledger.ledger.Ledger` puts the parts behind one
facade; nothing outside ``coordinator/ledger/`` uses this module.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import Connection, Row, bindparam, insert, select, update

from coordinator.config import CoordinatorConfig
from coordinator.ledger.change_feed import ChangeFeed
from coordinator.ledger.changes import NODE_SCOPED_KINDS, LedgerChanges, node_kind
from coordinator.ledger.replay import NonceClaim, claim_nonce
from coordinator.ledger.seeds import new_run_secret
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.migrations import migrate
from coordinator.ledger.storage.tables import events, nodes, run_state
from protocol import routes
from protocol.errors import ConfigError, ForbiddenError, ReplayedNonceError
from protocol.schemas import Role

RUN_ROW_ID = 1
_RUN_ROW = select(run_state).where(run_state.c.id == RUN_ROW_ID)  # built once: nearly every request reads it
_RUN_ROW_LOCKED = _RUN_ROW.with_for_update()
_INSERT_EVENT = insert(events)
NODE_ROW = select(nodes).where(nodes.c.node_id == bindparam("b_node_id"))
UPDATE_NODE = update(nodes).where(nodes.c.node_id == bindparam("b_node_id"))  # SET: the columns passed
_TOUCH_NODE = UPDATE_NODE.returning(*nodes.c)  # the row as updated, locked until the commit


def dumps(value: Any) -> str:
    """The ledger's stored JSON: compact, keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class LedgerCore:
    """One run's database: the run row and its secret, write transactions, the event log (module docstring)."""

    def __init__(
        self, database: Database, config: CoordinatorConfig, coordinator_id: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.db = database
        self.config = config
        self.scheduling = config.scheduling
        self.coordinator_id = coordinator_id
        self.clock = clock
        migrate(self.db)
        self.secret = self._load_or_create_run()
        """The run's secret: seeds the sampling and keys the audit choices; never leaves the ledger."""
        self.changes = LedgerChanges()
        """Told the event kinds of each committed write (see :mod:`coordinator.ledger.changes`)."""
        self._transaction = threading.local()  # .kinds: the event kinds of this thread's open write
        self.feed: ChangeFeed | None = None
        """Carries commits between the processes on one PostgreSQL ledger, once :meth:`share_changes` started it."""

    def _load_or_create_run(self) -> str:
        with self.db.write() as conn:
            row = conn.execute(_RUN_ROW).first()
            if row is None:
                secret = new_run_secret()
                conn.execute(
                    insert(run_state).values(
                        id=RUN_ROW_ID,
                        run_name=self.config.run_name,
                        secret_hex=secret,
                        current_policy_version=0,
                        next_group_index=0,
                        created_at=self.clock(),
                    )
                )
                return secret
            if row.run_name != self.config.run_name:
                raise ConfigError(
                    f"the ledger at {self.db.engine.url.render_as_string(hide_password=True)} belongs to run "
                    f"{row.run_name!r}, not {self.config.run_name!r}; use another data_dir or ledger.url"
                )
            return str(row.secret_hex)

    def share_changes(self) -> None:
        """On PostgreSQL, announce this process's commits to the other processes on the ledger (API replicas, the
        coordinator) and wake this one's waiters on theirs (:mod:`coordinator.ledger.change_feed`)."""
        if not self.db.is_sqlite and self.feed is None:
            self.feed = ChangeFeed(self.db, self.changes).start()

    def stop_sharing_changes(self) -> None:
        if self.feed is not None:
            self.feed.close()
            self.feed = None

    def read(self) -> AbstractContextManager[Connection]:
        """A read transaction: one consistent snapshot."""
        return self.db.read()

    @contextmanager
    def write(self, nonce: NonceClaim | None, durable: bool = True) -> Iterator[Connection]:
        """A write transaction that first claims the signed request's nonce (in the same commit).

        One transaction per request instead of two; a request refused by the ledger rolls back its
        nonce with everything else, which is harmless: replaying it changes nothing either.
        """
        kinds: set[str] = set()
        outer = getattr(self._transaction, "kinds", None)
        self._transaction.kinds = kinds
        try:
            with self.db.write(durable) as conn:
                if nonce is not None and not claim_nonce(conn, nonce, self.clock()):
                    raise ReplayedNonceError(
                        f"nonce {nonce.nonce} was already used by node {nonce.node_id}; requests cannot be replayed"
                    )
                yield conn
                if self.feed is not None:
                    self.feed.announce(conn, kinds)  # delivered to the other processes at the commit
        finally:
            self._transaction.kinds = outer
        self.changes.committed(kinds)  # only after the commit: a rolled-back write changed nothing

    def event(self, conn: Connection, kind: str, node_id: str | None, subject: str | None, **data: Any) -> None:
        """Append to the event log, in the write transaction ``conn``."""
        values = {"at": self.clock(), "kind": kind, "node_id": node_id, "subject": subject, "data_json": dumps(data)}
        conn.execute(_INSERT_EVENT, values)
        kinds = getattr(self._transaction, "kinds", None)
        if kinds is not None:
            kinds.add(kind)
            if kind in NODE_SCOPED_KINDS and node_id is not None:
                kinds.add(node_kind(kind, node_id))

    @staticmethod
    def run_row(conn: Connection, lock: bool = False) -> Row[Any]:
        """The run's row (``lock``: locked until the commit)."""
        return conn.execute(_RUN_ROW_LOCKED if lock else _RUN_ROW).one()

    def next_group_index(self, conn: Connection) -> int:
        """The group index the next new task will take (read only: SQLite keeps it in the run row, PostgreSQL in a
        sequence, :meth:`coordinator.ledger.leasing.Leases._next_group_index`)."""
        if self.db.is_sqlite:
            return int(self.run_row(conn).next_group_index)
        last, called = conn.exec_driver_sql("SELECT last_value, is_called FROM group_index_seq").one()
        return int(last) + 1 if called else int(last)

    def node(self, conn: Connection, node_id: str, role: Role | None, touch: dict[str, Any] | None = None) -> Row[Any]:
        """The node's row, or a 403 saying why it may not act in ``role`` (None: in any role). With ``touch``, in the
        same statement: the node is seen now, with those columns set too, and its row locked until the commit (a
        refusal rolls the update back)."""
        if touch is None:
            row = conn.execute(NODE_ROW, {"b_node_id": node_id}).first()
        else:
            values = {"b_node_id": node_id, "last_seen": self.clock(), **touch}
            row = conn.execute(_TOUCH_NODE, values).first()
        if row is None:
            raise ForbiddenError(f"node {node_id} is not registered; call POST {routes.NODES_REGISTER} first")
        if row.banned:
            raise ForbiddenError(f"node {node_id} is banned: {row.ban_reason}")
        if role is not None and row.role != role:
            raise ForbiddenError(f"node {node_id} registered as a {row.role}; this call is for a {role}")
        if not row.approved:
            raise ForbiddenError(f"validator {node_id} is not approved by the operator (trust.approved_validators)")
        return row

    def touch(self, conn: Connection, node_id: str) -> None:
        """The node is seen now."""
        conn.execute(UPDATE_NODE, {"b_node_id": node_id, "last_seen": self.clock()})
