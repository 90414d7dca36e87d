"""Which kinds of ledger events have committed: what lets waiters sleep until something happened instead of polling.

Every write transaction of the ledger collects the kinds of the events it appends (``lease``,
``submit``, ``verdict``, ``publish``, ...; see :class:`protocol.schemas.Event`) and, once it has
committed, tells :class:`LedgerChanges` (:meth:`LedgerChanges.committed`). A waiter takes a
:meth:`~LedgerChanges.mark` before it looks at the ledger and, when what it wants is not there
yet, waits until an event of a kind it cares about has committed since that mark: threads with
:meth:`~LedgerChanges.wait` (the orchestrator waiting for accepted groups), asyncio tasks with
:meth:`~LedgerChanges.wait_async` (the API's long-polls on leases and pending submissions).
Taking the mark first means a change that lands between the look and the wait is never missed.

Only this process's commits are counted here; on PostgreSQL :mod:`coordinator.ledger.change_feed`
adds the other processes' (API replicas on the same database). Every waiter also re-checks on a
bounded interval, which covers a feed that dropped its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterable

Mark = tuple[int, ...]
"""The commit counts of some kinds at one moment (:meth:`LedgerChanges.mark`)."""
NODE_SCOPED_KINDS = frozenset({"submit"})
"""Event kinds also reported per node, as :func:`node_kind` (a worker's own submission frees a place under its
lease cap; another worker's does not)."""


def node_kind(kind: str, node_id: str) -> str:
    """The change kind of ``node_id``'s own events of ``kind`` (one of :data:`NODE_SCOPED_KINDS`)."""
    return f"{kind}:{node_id}"


class LedgerChanges:
    """Commit counters per event kind, and the threads and asyncio tasks waiting for them to move."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._async_waiters: dict[asyncio.Event, tuple[asyncio.AbstractEventLoop, frozenset[str]]] = {}

    def mark(self, kinds: Iterable[str]) -> Mark:
        """The commit counts of ``kinds`` now (pass the same kinds, in the same order, to the wait)."""
        with self._cond:
            return tuple(self._counts[kind] for kind in kinds)

    def _moved(self, kinds: tuple[str, ...], since: Mark) -> bool:
        return any(self._counts[kind] != count for kind, count in zip(kinds, since, strict=True))

    def committed(self, kinds: Iterable[str]) -> None:
        """Events of ``kinds`` have committed: wake whoever waits for one of them."""
        kinds = set(kinds)
        if not kinds:
            return
        with self._cond:
            self._counts.update(kinds)
            self._cond.notify_all()
            woken = [(loop, event) for event, (loop, wanted) in self._async_waiters.items() if wanted & kinds]
        for loop, event in woken:
            with contextlib.suppress(RuntimeError):  # that loop has closed: its waiter is gone with it
                loop.call_soon_threadsafe(event.set)

    def wait(self, kinds: Iterable[str], since: Mark, timeout_s: float) -> bool:
        """Block until an event of ``kinds`` committed after ``since``, at most ``timeout_s``; True if one did."""
        wanted = tuple(kinds)
        with self._cond:
            return self._cond.wait_for(lambda: self._moved(wanted, since), timeout=max(0.0, timeout_s))

    async def wait_async(self, kinds: Iterable[str], since: Mark, timeout_s: float) -> bool:
        """:meth:`wait` for an asyncio task: the event loop goes on while it waits."""
        wanted = tuple(kinds)
        event = asyncio.Event()
        with self._cond:
            if self._moved(wanted, since):
                return True
            self._async_waiters[event] = (asyncio.get_running_loop(), frozenset(wanted))
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout_s))
            return True
        except TimeoutError:
            with self._cond:
                return self._moved(wanted, since)
        finally:
            with self._cond:
                self._async_waiters.pop(event, None)

    @property
    def num_async_waiters(self) -> int:
        with self._cond:
            return len(self._async_waiters)
