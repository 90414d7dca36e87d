"""Long-polls on leases and pending lists: woken by the ledger's changes, bounded, validated, fair to rate limits."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import httpx
import pytest
from fastapi import Request

from coordinator.ledger.changes import LedgerChanges
from coordinator.serving import longpoll
from coordinator.serving.longpoll import LongPolls
from protocol.schemas import ErrorBody, HeartbeatRequest, LeaseRequest
from protocol.signing import sign_request
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import MakeHarness

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_rechecks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters ask again only when a change wakes them: what a test sees came from the change feed."""
    monkeypatch.setattr(longpoll, "RECHECK_S", 60.0)


async def test_a_waiting_lease_gets_the_task_another_worker_abandons(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__max_open_leases=1)
    holder, waiter = await harness.worker(), await harness.worker()
    (task,) = (await holder.lease(LeaseRequest())).tasks
    assert (await waiter.lease(LeaseRequest())).retry_after_s > 0  # a plain request: empty, come back later
    started = time.monotonic()
    waiting = asyncio.create_task(waiter.lease(LeaseRequest(), wait_s=15.0))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await holder.abandon(task.lease_id)
    (again,) = (await asyncio.wait_for(waiting, 10.0)).tasks
    assert again.task_id == task.task_id
    assert time.monotonic() - started < 10.0
    await holder.aclose()
    await waiter.aclose()


async def test_a_waiting_lease_wakes_on_its_own_submission_under_its_cap(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__max_leases_per_node=1)
    worker = await harness.worker()
    (task,) = (await worker.lease(LeaseRequest())).tasks
    waiting = asyncio.create_task(worker.lease(LeaseRequest(), wait_s=15.0))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await worker.submit(submission_for(task))
    (following,) = (await asyncio.wait_for(waiting, 10.0)).tasks
    assert following.task_id != task.task_id
    await worker.aclose()


async def test_a_lease_that_waited_its_time_out_says_ask_again_at_once(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__max_open_leases=1)
    holder, waiter = await harness.worker(), await harness.worker()
    await holder.lease(LeaseRequest())
    started = time.monotonic()
    answer = await waiter.lease(LeaseRequest(), wait_s=0.4)
    assert answer.tasks == [] and answer.retry_after_s == 0.0
    assert time.monotonic() - started >= 0.4
    await holder.aclose()
    await waiter.aclose()


async def test_a_validator_hears_of_a_submission_while_it_waits(make_harness: MakeHarness) -> None:
    harness = make_harness()
    worker, validator = await harness.worker(), await harness.validator()
    (task,) = (await worker.lease(LeaseRequest())).tasks
    waiting = asyncio.create_task(validator.pending(wait_s=15.0))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    answer = await worker.submit(submission_for(task))
    (pending,) = (await asyncio.wait_for(waiting, 10.0)).submissions
    assert pending.submission_id == answer.submission_id
    await worker.aclose()
    await validator.aclose()


@pytest.mark.parametrize("wait_s", ["-1", "20.5", "nan", "soon"])
async def test_a_bad_wait_is_refused_with_its_reason(make_harness: MakeHarness, wait_s: str) -> None:
    harness = make_harness()
    worker, validator = await harness.worker(), await harness.validator()
    body = b'{"v":1,"max_tasks":1}'
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger") as http:
        for identity, method, path, content in (
            (worker.identity, "POST", f"/v1/leases?wait_s={wait_s}", body),
            (validator.identity, "GET", f"/v1/submissions/pending?wait_s={wait_s}", b""),
        ):
            headers = {"Content-Type": "application/json", **sign_request(identity, method, path, content)}
            response = await http.request(method, path, content=content or None, headers=headers)
            assert response.status_code == 400, response.text
            error = ErrorBody.model_validate_json(response.content)
            assert error.error == "malformed" and "wait_s" in error.detail
    await worker.aclose()
    await validator.aclose()


async def test_a_node_over_its_long_poll_cap_is_answered_at_once(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__max_open_leases=1, api__max_long_polls_per_node=1)
    holder, waiter = await harness.worker(), await harness.worker()
    await holder.lease(LeaseRequest())
    first = asyncio.create_task(waiter.lease(LeaseRequest(), wait_s=15.0))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    second = await waiter.lease(LeaseRequest(), wait_s=15.0)
    assert second.tasks == [] and second.retry_after_s > 0  # not held: the plain answer
    assert time.monotonic() - started < 5.0
    assert not first.done()
    first.cancel()
    await holder.aclose()
    await waiter.aclose()


async def test_a_waiting_long_poll_leaves_its_source_slot_to_the_sources_other_calls(
    make_harness: MakeHarness,
) -> None:
    harness = make_harness(
        sources__allow=[],
        sources__max_requests_in_flight=1,
        sources__max_requests_waiting=0,
        scheduling__max_open_leases=1,
    )
    holder = await harness.worker(address="198.51.100.7")
    worker = await harness.worker(address="198.51.100.8")  # same source (network prefix) as the holder
    await holder.lease(LeaseRequest())
    waiting = asyncio.create_task(worker.lease(LeaseRequest(), wait_s=15.0))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    # With the slot held, this would be refused (no room to wait) or stuck until the long-poll ends.
    beat = await asyncio.wait_for(worker.heartbeat(HeartbeatRequest(policy_versions_held=[0], tokens_per_s=0.0)), 5.0)
    assert beat.current_policy_version == 0
    assert not waiting.done()
    waiting.cancel()
    await holder.aclose()
    await worker.aclose()


class FakeRequest:
    """The parts of a Starlette request a long-poll uses; ``gone``: its client went away after the first answer."""

    def __init__(self, gone: bool = True) -> None:
        self.scope: dict[str, Any] = {}
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


async def test_a_long_poll_whose_client_has_gone_stops_asking() -> None:
    changes = LedgerChanges()
    polls = LongPolls(changes, max_per_node=4, recheck_s=60.0)
    attempts: list[bool] = []

    async def attempt(first: bool) -> list[str]:
        attempts.append(first)
        return []

    async def change_soon() -> None:
        await asyncio.sleep(0.1)
        changes.committed(["publish"])

    changing = asyncio.create_task(change_soon())
    request = cast(Request, FakeRequest())
    answer, waited_out = await polls.answer(request, "n", 10.0, ("publish",), attempt, bool)
    assert (answer, waited_out, attempts) == ([], False, [True])  # no second attempt: nobody would hear it
    assert polls.waiting == {}
    await changing


async def test_waiting_long_polls_answer_when_the_server_closes() -> None:
    polls = LongPolls(LedgerChanges(), max_per_node=4, recheck_s=60.0)
    closing = asyncio.Event()
    polls.closing = closing.is_set
    attempts: list[bool] = []

    async def attempt(first: bool) -> list[str]:
        attempts.append(first)
        return []

    asyncio.get_running_loop().call_later(0.2, closing.set)
    started = time.monotonic()
    request = cast(Request, FakeRequest(gone=False))
    answer, waited_out = await polls.answer(request, "n", 15.0, ("publish",), attempt, bool)
    assert (answer, waited_out, attempts) == ([], False, [True])
    assert time.monotonic() - started < 5.0  # not the 15 s asked for: shutdown is not held up
