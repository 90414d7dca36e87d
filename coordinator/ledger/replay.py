"""The durable replay cache: nonces of signed requests remembered in the ledger database.

Implements :class:`protocol.signing.ReplayCache`. A nonce is stored until its request's
timestamp leaves the clock-skew window (after that the timestamp alone is refused), so the
table stays small: the background maintenance prunes expired rows. Because the nonces live in
the database, a replayed request is refused after a coordinator restart too, and by every
replica sharing the database. The API stores a request's nonce in the same transaction as the
request's effect (:class:`DeferredNonce`, :func:`claim_nonce`): one commit per request, and a
request whose effect is stored always has its nonce stored with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, delete, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import nonces


@dataclass(frozen=True)
class NonceClaim:
    """A verified request's nonce, to be stored by the transaction that carries out the request."""

    node_id: str
    nonce: str
    expires_at: float


# Built once: every signed request runs these (see coordinator.ledger.storage.engine on prebuilt statements).
_STORE_NONCE = {
    "sqlite": sqlite_insert(nonces).on_conflict_do_nothing().returning(nonces.c.nonce),
    "postgresql": postgresql_insert(nonces).on_conflict_do_nothing().returning(nonces.c.nonce),
}
_REUSE_EXPIRED_NONCE = (
    update(nonces)
    .where(
        nonces.c.node_id == bindparam("b_node_id"),
        nonces.c.nonce == bindparam("b_nonce"),
        nonces.c.expires_at <= bindparam("b_now"),
    )
    .values(expires_at=bindparam("b_expires_at"))
)


def claim_nonce(conn: Connection, claim: NonceClaim, now: float) -> bool:
    """Store the nonce in this transaction; False when it is stored already and unexpired (a replay)."""
    values = {"node_id": claim.node_id, "nonce": claim.nonce, "expires_at": claim.expires_at}
    if conn.execute(_STORE_NONCE[conn.dialect.name], values).first() is not None:  # (rowcount: unreliable, psycopg)
        return True
    # Already stored: a replay, unless the old entry expired and was not pruned yet.
    reused = conn.execute(
        _REUSE_EXPIRED_NONCE,
        {"b_node_id": claim.node_id, "b_nonce": claim.nonce, "b_now": now, "b_expires_at": claim.expires_at},
    )
    return reused.rowcount == 1


class DeferredNonce:
    """A ReplayCache for one request that records the nonce instead of storing it.

    The API verifies a request's signature with this, then hands :attr:`claim` to the ledger,
    which stores it in the request's own transaction (see :func:`claim_nonce`).
    """

    def __init__(self) -> None:
        self.claim: NonceClaim | None = None

    def remember(self, node_id: str, nonce: str, expires_at: float) -> bool:
        self.claim = NonceClaim(node_id, nonce, expires_at)
        return True


class DatabaseReplayCache:
    """The ReplayCache over the ledger database, for callers outside a ledger transaction."""

    def __init__(self, database: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = database
        self.clock = clock

    def remember(self, node_id: str, nonce: str, expires_at: float) -> bool:
        with self.db.write(durable=False) as conn:
            return claim_nonce(conn, NonceClaim(node_id, nonce, expires_at), self.clock())

    def prune(self) -> int:
        """Forget expired nonces; returns how many."""
        with self.db.write(durable=False) as conn:
            return conn.execute(delete(nonces).where(nonces.c.expires_at <= self.clock())).rowcount
