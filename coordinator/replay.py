"""The durable replay cache: nonces of signed requests remembered in the ledger database.

Implements :class:`protocol.signing.ReplayCache`. A nonce is stored until its request's
timestamp leaves the clock-skew window (after that the timestamp alone is refused), so the
table stays small: the background maintenance prunes expired rows. Because the nonces live in
the database, a replayed request is refused after a coordinator restart too, and by every
replica sharing the database. Nonce writes do not wait for PostgreSQL's WAL flush (soft
state: a crash of the database server itself could forget the last instant of nonces, whose
timestamps then stay valid for at most the skew window).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import delete, insert, update
from sqlalchemy.exc import IntegrityError

from coordinator.storage.engine import Database
from coordinator.storage.tables import nonces


class DatabaseReplayCache:
    def __init__(self, database: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = database
        self.clock = clock

    def remember(self, node_id: str, nonce: str, expires_at: float) -> bool:
        try:
            with self.db.write(durable=False) as conn:
                conn.execute(insert(nonces).values(node_id=node_id, nonce=nonce, expires_at=expires_at))
            return True
        except IntegrityError:
            pass
        # Already stored: a replay, unless the old entry expired and was not pruned yet.
        with self.db.write(durable=False) as conn:
            reused = conn.execute(
                update(nonces)
                .where(nonces.c.node_id == node_id, nonces.c.nonce == nonce, nonces.c.expires_at <= self.clock())
                .values(expires_at=expires_at)
            )
            return reused.rowcount == 1

    def prune(self) -> int:
        """Forget expired nonces; returns how many."""
        with self.db.write(durable=False) as conn:
            return conn.execute(delete(nonces).where(nonces.c.expires_at <= self.clock())).rowcount
