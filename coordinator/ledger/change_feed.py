"""Ledger changes across processes: PostgreSQL's LISTEN/NOTIFY carries what one API replica committed to the rest.

:class:`~coordinator.ledger.changes.LedgerChanges` only sees its own process's commits. On PostgreSQL
every write transaction also sends one notification (:meth:`ChangeFeed.announce`, inside the
transaction, so PostgreSQL delivers it at the commit and drops it with a rollback) naming the
sending process and the committed event kinds. Each process listens on the ledger's channel on a
connection of its own, in a thread, and hands the other processes' kinds to its ``LedgerChanges``:
a long-poll on one replica wakes within milliseconds of a write through another. The channel is
named after the database and schema, like the ledger's lock, so two ledgers on one server never
hear each other. A dropped listening connection is dialled again; what was committed meanwhile
is found by the waiters' bounded re-check.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Collection, Iterable

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from coordinator.ledger.changes import LedgerChanges
from coordinator.ledger.storage.engine import Database, ledger_scope

log = logging.getLogger(__name__)
MAX_PAYLOAD_BYTES = 7900
"""PostgreSQL refuses notification payloads of 8000 bytes or more; node-scoped kinds beyond this are left out."""
NOTIFY = text("SELECT pg_notify(:channel, :payload)")
RECONNECT_S = (0.2, 5.0)
"""The first and the longest wait before dialling a dropped listening connection again."""


def channel_name(scope: str) -> str:
    """The notification channel of the ledger at ``scope`` (``database.schema``)."""
    return "prime_ledger_" + hashlib.sha256(f"prime-network changes {scope}".encode()).hexdigest()[:24]


def encode_kinds(origin: str, kinds: Iterable[str]) -> str:
    """One notification's payload: the origin, then the kinds one per line (plain kinds first, within the limit)."""
    payload = origin
    for kind in sorted(kinds, key=lambda k: (":" in k, k)):
        if len(payload) + 1 + len(kind.encode()) > MAX_PAYLOAD_BYTES:
            break
        payload += "\n" + kind
    return payload


def decode_kinds(payload: str) -> tuple[str, list[str]]:
    """(origin, kinds) of a payload :func:`encode_kinds` made."""
    origin, *kinds = payload.split("\n")
    return origin, [kind for kind in kinds if kind]


class ChangeFeed:
    """This process's end of the ledger's change channel: it announces its commits and hears the others'."""

    def __init__(self, database: Database, changes: LedgerChanges) -> None:
        self.database = database
        self.changes = changes
        self.origin = uuid.uuid4().hex[:16]
        with database.read() as conn:
            self.channel = channel_name(ledger_scope(conn))
        self.others = True
        """Whether other API processes serve the ledger (their heartbeats, ``api_processes``): alone, nothing is
        announced. The others learn of a replica that starts at their next maintenance round
        (``api.maintenance_interval_s``); until then its waiters' re-check finds their writes."""
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._listen_forever, name="ledger-change-feed", daemon=True)

    def announce(self, conn: Connection, kinds: Collection[str]) -> None:
        """Tell the other processes (at this transaction's commit) that events of ``kinds`` committed."""
        if kinds and self.others:
            conn.execute(NOTIFY, {"channel": self.channel, "payload": encode_kinds(self.origin, kinds)})

    def start(self, timeout_s: float = 10.0) -> ChangeFeed:
        """Start listening; returns once the channel is listened to (or after ``timeout_s``, listening later)."""
        self._thread.start()
        if not self._listening.wait(timeout_s):
            log.warning("the ledger change feed is not listening yet; other replicas' writes wake waiters late")
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _listen_forever(self) -> None:
        import psycopg

        url = make_url(self.database.url).set(drivername="postgresql").render_as_string(hide_password=False)
        wait = RECONNECT_S[0]
        while not self._stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True) as connection:
                    connection.execute(f'LISTEN "{self.channel}"')
                    self._listening.set()
                    wait = RECONNECT_S[0]
                    while not self._stop.is_set():
                        for notice in connection.notifies(timeout=0.5):
                            self._heard(notice.payload)
            except psycopg.Error as exc:
                self._listening.clear()
                log.warning("ledger change feed: %s; listening again in %.1f s", str(exc).strip(), wait)
                self._stop.wait(wait)
                wait = min(RECONNECT_S[1], wait * 2)

    def _heard(self, payload: str) -> None:
        origin, kinds = decode_kinds(payload)
        if origin != self.origin:  # our own commits were counted when they committed
            self.changes.committed(kinds)
