"""The API processes serving one ledger (the coordinator and its replicas), each known by a heartbeat row.

Rate limits are token buckets in each process's memory. Behind a load balancer that spreads a
client's requests over N processes, each process enforcing the whole limit would let the client
make N times it; each enforces 1/N of it instead (:meth:`ApiProcesses.beat` returns N), so the
sum over the processes never exceeds the setting and round robin gives an honest client the
whole of it. A process beats every maintenance round and removes its row when it stops; a row
not renewed for :data:`STALE_ROUNDS` rounds (a killed process) is dropped by the next beat of any
other. Until then the survivors keep their smaller shares, which only errs towards refusing.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable

from sqlalchemy import delete, func, insert, select, update

from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import api_processes

STALE_ROUNDS = 3
"""Maintenance rounds without a heartbeat after which an API process counts as gone."""


class ApiProcesses:
    """This process's row among the ledger's API processes."""

    def __init__(self, database: Database, interval_s: float, clock: Callable[[], float] = time.time) -> None:
        self.database = database
        self.interval_s = interval_s
        self.clock = clock
        self.process_id = uuid.uuid4().hex[:16]
        self.started_at = clock()

    def beat(self) -> int:
        """Renew this process's row, drop the stale ones; how many API processes serve the ledger now (>= 1)."""
        now = self.clock()
        with self.database.write(durable=False) as conn:
            conn.execute(delete(api_processes).where(api_processes.c.last_seen < now - STALE_ROUNDS * self.interval_s))
            renewed = conn.execute(
                update(api_processes).where(api_processes.c.process_id == self.process_id).values(last_seen=now)
            )
            if renewed.rowcount == 0:
                conn.execute(
                    insert(api_processes).values(
                        process_id=self.process_id, host=socket.gethostname(), started_at=self.started_at, last_seen=now
                    )
                )
            count = conn.execute(select(func.count()).select_from(api_processes)).scalar_one()
        return max(1, int(count))

    def leave(self) -> None:
        """Remove this process's row (it stops serving)."""
        with self.database.write(durable=False) as conn:
            conn.execute(delete(api_processes).where(api_processes.c.process_id == self.process_id))
