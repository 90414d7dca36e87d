"""Long-polls: a lease or pending-list request that finds nothing waits, up to its ``wait_s``, for a change.

``POST /v1/leases?wait_s=S`` and ``GET /v1/submissions/pending?wait_s=S`` first answer as a plain
request would. When that answer is empty (no task leased, nothing to audit) the request waits
until the ledger commits an event that could change it (:mod:`coordinator.ledger.changes`), asks
the ledger again, and answers as soon as it finds something or ``S`` has passed. So a worker
hears of a new policy version, and a validator of a new submission, when it happens rather
than at its next poll.

What waiting costs the network is bounded: a long-poll is one request to the rate limits (one
token of the node's and the address's buckets, however long it waits); while it waits it gives
its source's concurrency slot back (:class:`~coordinator.serving.middleware.SourceSlot`), so a
worker's submissions never queue behind its own long-poll; a node holds at most
``api.max_long_polls_per_node`` waiting long-polls (further ones are answered at once, as a
plain request); a long-poll whose client has gone, or on a server shutting down, stops asking (so no task
is leased to nobody, and shutdown is not held up);
and each waiter asks the ledger again at most every :data:`RECHECK_S` when no change wakes it
(on PostgreSQL another API replica's change wakes it through :mod:`coordinator.ledger.change_feed`;
the re-check covers a dropped feed connection).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fastapi import Request

from coordinator.ledger.changes import LedgerChanges, Mark, node_kind
from coordinator.serving.middleware import SLOT_SCOPE_KEY, SourceSlot

T = TypeVar("T")

RECHECK_S = 2.0
"""How often a waiting long-poll asks the ledger again when nothing woke it (the plain polls' retry delay)."""
CLOSING_CHECK_S = 0.5
"""How often a waiting long-poll looks whether its client has gone or the server is closing."""
LEASE_WAKE_KINDS = ("abandon", "expire", "verdict", "ban", "publish", "train_step")
"""Events after which a lease may succeed where it did not: tasks re-opened, a new policy, room freed (and the
worker's own submissions: :func:`lease_wake_kinds`)."""
PENDING_WAKE_KINDS = ("submit",)
"""Events after which a validator's pending list may hold something new."""


def lease_wake_kinds(node_id: str) -> tuple[str, ...]:
    """What wakes ``node_id``'s lease long-poll: :data:`LEASE_WAKE_KINDS` and its own submissions, each of which
    frees a place under its lease cap."""
    return (*LEASE_WAKE_KINDS, node_kind("submit", node_id))


class LongPolls:
    """Runs long-polls over one ledger's change feed and counts each node's waiting ones."""

    def __init__(self, changes: LedgerChanges, max_per_node: int, recheck_s: float | None = None) -> None:
        self.changes = changes
        self.max_per_node = max_per_node
        self.recheck_s = RECHECK_S if recheck_s is None else recheck_s
        self.waiting: Counter[str] = Counter()
        """Long-polls waiting now, per node id."""
        self.closing: Callable[[], bool] = lambda: False
        """True once the server is shutting down: waiting long-polls answer (empty) within CLOSING_CHECK_S, so
        they never hold up its graceful shutdown. The service sets it (uvicorn's ``should_exit``)."""

    async def answer(
        self,
        request: Request,
        node_id: str,
        wait_s: float,
        kinds: Sequence[str],
        attempt: Callable[[bool], Awaitable[T]],
        found: Callable[[T], bool],
    ) -> tuple[T, bool]:
        """The answer of ``attempt`` (called with True the first time: the request's own nonce goes with it), asked
        again after each change of ``kinds`` until ``found`` says it holds something or ``wait_s`` has passed.

        Returns the answer and whether the long-poll waited ``wait_s`` out (False when it found something,
        did not wait at all, its client went away or the server is closing)."""
        mark = self.changes.mark(kinds)
        result = await attempt(True)
        if found(result) or wait_s <= 0 or self.waiting[node_id] >= self.max_per_node:
            return result, False
        slot: SourceSlot | None = request.scope.get(SLOT_SCOPE_KEY)
        deadline = time.monotonic() + wait_s
        self.waiting[node_id] += 1
        try:
            while time.monotonic() < deadline:
                async with slot.released() if slot is not None else contextlib.nullcontext():
                    until = min(deadline, time.monotonic() + self.recheck_s)
                    gone = await self._sleep(request, kinds, mark, until)
                if gone:
                    return result, False
                mark = self.changes.mark(kinds)
                result = await attempt(False)
                if found(result):
                    return result, False
            return result, True
        finally:
            self.waiting[node_id] -= 1
            if self.waiting[node_id] <= 0:
                del self.waiting[node_id]

    async def _sleep(self, request: Request, kinds: Sequence[str], mark: Mark, until: float) -> bool:
        """Wait until ``kinds`` moved past ``mark`` or ``until``; True (stop asking) when the client went away or
        the server is closing meanwhile."""
        while True:
            if self.closing() or await request.is_disconnected():
                return True
            left = until - time.monotonic()
            if left <= 0 or await self.changes.wait_async(kinds, mark, min(left, CLOSING_CHECK_S)):
                return self.closing() or await request.is_disconnected()
