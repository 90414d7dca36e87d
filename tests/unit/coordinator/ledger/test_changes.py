"""LedgerChanges: committed event kinds wake the threads and asyncio tasks waiting for them, and nothing else does."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy import select

from coordinator.ledger.changes import LedgerChanges
from coordinator.ledger.storage.tables import events
from protocol.schemas import LeaseRequest
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import LedgerHarness


def test_a_thread_wakes_on_a_kind_it_waits_for_and_not_on_others() -> None:
    changes = LedgerChanges()
    mark = changes.mark(["verdict"])
    changes.committed(["lease", "renew"])
    assert not changes.wait(["verdict"], mark, 0.05)
    woke = threading.Event()

    def waiter() -> None:
        if changes.wait(["verdict"], mark, 5.0):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.05)
    changes.committed(["verdict"])
    thread.join(5.0)
    assert woke.is_set()


def test_a_change_between_the_mark_and_the_wait_is_not_missed() -> None:
    changes = LedgerChanges()
    mark = changes.mark(["submit"])
    changes.committed(["submit"])
    started = time.monotonic()
    assert changes.wait(["submit"], mark, 5.0)
    assert asyncio.run(changes.wait_async(["submit"], mark, 5.0))
    assert time.monotonic() - started < 1.0


def test_an_asyncio_waiter_is_woken_from_another_thread_and_unregistered() -> None:
    changes = LedgerChanges()

    async def main() -> tuple[bool, bool]:
        mark = changes.mark(["publish", "abandon"])
        waiting = asyncio.create_task(changes.wait_async(["publish", "abandon"], mark, 5.0))
        await asyncio.sleep(0.05)
        assert changes.num_async_waiters == 1
        threading.Thread(target=changes.committed, args=(["abandon"],)).start()
        woken = await waiting
        timed_out = await changes.wait_async(["publish"], changes.mark(["publish"]), 0.05)
        return woken, timed_out

    started = time.monotonic()
    assert asyncio.run(main()) == (True, False)
    assert time.monotonic() - started < 2.0
    assert changes.num_async_waiters == 0


@pytest.mark.anyio
async def test_the_ledger_reports_committed_kinds_and_not_rolled_back_ones(harness: LedgerHarness) -> None:
    changes = harness.ledger.changes
    mark = changes.mark(["lease", "submit", "hand_out"])
    worker = await harness.worker()
    (task,) = (await worker.lease(LeaseRequest())).tasks
    assert changes.wait(["lease"], mark[:1], 0)
    assert not changes.wait(["submit"], mark[1:2], 0)
    with pytest.raises(Exception, match="boom"), harness.ledger.core.write(None) as conn:
        harness.ledger.core.event(conn, "submit", None, None)
        raise RuntimeError("boom")
    assert not changes.wait(["submit"], mark[1:2], 0)  # rolled back: nobody is told
    await worker.submit(submission_for(task))
    assert changes.wait(["submit"], mark[1:2], 0)
    validator = await harness.validator()
    assert not changes.wait(["hand_out"], mark[2:], 0)
    (pending,) = (await validator.pending()).submissions
    assert changes.wait(["hand_out"], mark[2:], 0)
    with harness.database.read() as conn:
        row = conn.execute(select(events).where(events.c.kind == "hand_out")).one()
    assert row.node_id == validator.identity.node_id and pending.submission_id in row.data_json
    await worker.aclose()
    await validator.aclose()
