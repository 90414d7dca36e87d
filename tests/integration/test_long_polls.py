"""Long-polls against a real `prime-coordinator start`: woken by what happens, not by the clock, and never in
the way of a shutdown.

The clients are the nodes' own :class:`protocol.ledger_client.LedgerClient` over real HTTP to uvicorn; the
rollouts are well-formed stand-ins (the ledger checks their shape; no validator audits them here).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest
from tests.support.ledger_helpers import register_request, submission_for
from tests.support.network import Network, running_network

pytestmark = pytest.mark.slow


async def registered(net: Network, role: str) -> LedgerClient:
    client = LedgerClient(net.url, NodeIdentity.generate())
    await client.register(register_request(role))
    return client


def test_validators_and_workers_hear_of_work_when_it_happens(network: Network) -> None:
    async def main() -> None:
        worker, validator = await registered(network, "worker"), await registered(network, "validator")
        waiting = asyncio.create_task(validator.pending(wait_s=15.0))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        first, second = [(await worker.lease(LeaseRequest())).tasks[0] for _ in range(2)]  # its cap: 2
        # A third lease waits for a place under the cap; the worker's own submission frees one.
        leasing = asyncio.create_task(worker.lease(LeaseRequest(), wait_s=15.0))
        await asyncio.sleep(0.5)
        assert not leasing.done()
        submitted_at = time.monotonic()
        answer = await worker.submit(submission_for(first))
        (pending,) = (await asyncio.wait_for(waiting, 20.0)).submissions
        (third,) = (await asyncio.wait_for(leasing, 20.0)).tasks
        took_s = time.monotonic() - submitted_at
        assert pending.submission_id == answer.submission_id
        assert third.task_id not in (first.task_id, second.task_id)
        assert took_s < 10.0  # well inside the 15 s asked for: woken, not timed out
        (hand_out,) = network.events("hand_out")
        assert hand_out["node_id"] == validator.identity.node_id
        assert hand_out["data"]["submission_ids"] == [answer.submission_id]
        await worker.aclose()
        await validator.aclose()

    asyncio.run(main())


def test_a_waiting_long_poll_is_answered_when_the_coordinator_stops(tmp_path: Path) -> None:
    async def main(net: Network) -> None:
        worker = await registered(net, "worker")
        for _ in range(2):
            await worker.lease(LeaseRequest())
        leasing = asyncio.create_task(worker.lease(LeaseRequest(), wait_s=20.0))
        await asyncio.sleep(0.5)
        assert not leasing.done()
        started = time.monotonic()
        await asyncio.to_thread(net.coordinator.stop)
        answer = await asyncio.wait_for(leasing, 20.0)  # an answer, not a connection cut at the graceful timeout
        assert answer.tasks == []
        assert time.monotonic() - started < 20.0
        await worker.aclose()

    with running_network(tmp_path) as net:
        asyncio.run(main(net))
