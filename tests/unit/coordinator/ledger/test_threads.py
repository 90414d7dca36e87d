"""LedgerThreads runs ledger calls in worker threads, never more at once than configured."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from coordinator.serving.app import LedgerThreads


@pytest.mark.anyio
async def test_ledger_calls_run_in_threads_at_most_num_threads_at_once() -> None:
    in_thread = LedgerThreads(num_threads=3)
    running = 0
    most_running = 0
    thread_ids: set[int] = set()
    lock = threading.Lock()

    def call(value: int) -> int:
        nonlocal running, most_running
        with lock:
            running += 1
            most_running = max(most_running, running)
            thread_ids.add(threading.get_ident())
        time.sleep(0.02)
        with lock:
            running -= 1
        return value * 2

    results: list[int] = []

    async def one(value: int) -> None:
        results.append(await in_thread(call, value))

    async with anyio.create_task_group() as group:
        for value in range(12):
            group.start_soon(one, value)
    assert sorted(results) == [2 * value for value in range(12)]
    assert most_running == 3
    assert threading.get_ident() not in thread_ids
