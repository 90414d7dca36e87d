"""Hostile and broken requests: each one gets a 4xx JSON error body with a reason, never a 5xx."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE
from protocol.schemas import ErrorBody, LeaseRequest, Task
from protocol.signing import HEADER_NONCE, sign_document, sign_request
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio
LEASE_BODY = b'{"v":1,"max_tasks":1}'


def raw_client(harness: LedgerHarness) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger")


async def signed_post(
    client: httpx.AsyncClient, identity: NodeIdentity, path: str, body: bytes, **extra_headers: str
) -> httpx.Response:
    headers = {"Content-Type": "application/json", **sign_request(identity, "POST", path, body), **extra_headers}
    return await client.post(path, content=body, headers=headers)


def refusal(response: httpx.Response, status: int, code: str) -> str:
    """Check a refusal's status and machine code; return its reason for further checks."""
    assert response.status_code == status, response.text
    body = ErrorBody.model_validate_json(response.content)
    assert body.error == code and body.v == 1
    assert len(body.detail) > 10
    return body.detail


async def leased_task(harness: LedgerHarness, identity: NodeIdentity) -> Task:
    client = harness.client(identity)
    from tests.support.ledger_helpers import register_request

    await client.register(register_request("worker"))
    (task,) = (await client.lease(LeaseRequest())).tasks
    await client.aclose()
    return task


@pytest.fixture
async def http(harness: LedgerHarness) -> AsyncIterator[httpx.AsyncClient]:
    async with raw_client(harness) as client:
        yield client


async def test_unsigned_request(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/leases", content=LEASE_BODY, headers={"Content-Type": "application/json"})
    assert "missing header" in refusal(response, 401, "unsigned")


async def test_bad_signature(http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    headers = sign_request(identity, "POST", "/v1/leases", LEASE_BODY)
    response = await http.post("/v1/leases", content=LEASE_BODY.replace(b"1}", b"9}"), headers=headers)
    assert "does not verify" in refusal(response, 401, "bad_signature")


async def test_replayed_nonce(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    await leased_task(harness, identity)
    headers = {"Content-Type": "application/json", **sign_request(identity, "POST", "/v1/leases", LEASE_BODY)}
    first = await http.post("/v1/leases", content=LEASE_BODY, headers=headers)
    assert first.status_code == 200
    replay = await http.post("/v1/leases", content=LEASE_BODY, headers=headers)
    assert headers[HEADER_NONCE] in refusal(replay, 401, "replayed_nonce")


async def test_replay_is_refused_after_a_restart(harness: LedgerHarness, make_harness: MakeHarness) -> None:
    identity = NodeIdentity.generate()
    await leased_task(harness, identity)
    headers = {"Content-Type": "application/json", **sign_request(identity, "POST", "/v1/leases", LEASE_BODY)}
    async with raw_client(harness) as client:
        assert (await client.post("/v1/leases", content=LEASE_BODY, headers=headers)).status_code == 200
    restarted = make_harness()  # same database, new process state
    async with raw_client(restarted) as client:
        refusal(await client.post("/v1/leases", content=LEASE_BODY, headers=headers), 401, "replayed_nonce")


async def test_stale_timestamp(http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    headers = sign_request(identity, "POST", "/v1/leases", LEASE_BODY, now=time.time() - 300)
    response = await http.post("/v1/leases", content=LEASE_BODY, headers=headers)
    assert "clock" in refusal(response, 401, "stale_timestamp")


async def test_oversize_body_declared(make_harness: MakeHarness) -> None:
    harness = make_harness(api__max_body_bytes=1024)
    async with raw_client(harness) as client:
        response = await client.post("/v1/leases", content=b"x" * 5000)
        assert "5000 bytes" in refusal(response, 413, "payload_too_large")


async def test_oversize_body_streamed_without_length(make_harness: MakeHarness) -> None:
    harness = make_harness(api__max_body_bytes=1024)
    chunks_sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal chunks_sent
        for _ in range(100):
            chunks_sent += 1
            yield b"y" * 512

    async with raw_client(harness) as client:
        response = await client.post("/v1/leases", content=body())
        assert "limit 1024 bytes" in refusal(response, 413, "payload_too_large")
    assert chunks_sent < 10  # cut off at the limit, not read to the end


async def test_malformed_json(http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    response = await signed_post(http, identity, "/v1/leases", b'{"v":1,"max_tasks":')
    assert "JSON" in refusal(response, 400, "malformed")


async def test_wrong_types_with_a_valid_signature(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    await leased_task(harness, identity)
    response = await signed_post(http, identity, "/v1/leases", b'{"v":1,"max_tasks":"lots"}')
    assert "max_tasks" in refusal(response, 400, "malformed")
    unknown_field = await signed_post(http, identity, "/v1/leases", b'{"v":1,"max_tasks":1,"gimme":true}')
    assert "gimme" in refusal(unknown_field, 400, "malformed")
    other_version = await signed_post(http, identity, "/v1/leases", b'{"v":2,"max_tasks":1}')
    assert "v:" in refusal(other_version, 400, "malformed")


async def submit_raw(http: httpx.AsyncClient, identity: NodeIdentity, document: dict[str, object]) -> httpx.Response:
    body = json.dumps(document).encode()
    signature = sign_document(identity, document)
    return await signed_post(http, identity, "/v1/submissions", body, **{HEADER_SUBMISSION_SIGNATURE: signature})


async def test_unknown_task_and_unknown_lease(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    task = await leased_task(harness, identity)
    wrong_task = submission_for(task, task_id="t999999").model_dump(mode="json")
    assert "not t999999" in refusal(await submit_raw(http, identity, wrong_task), 409, "conflict")
    unknown_lease = submission_for(task, lease_id="l-nope").model_dump(mode="json")
    assert "no lease 'l-nope'" in refusal(await submit_raw(http, identity, unknown_lease), 404, "not_found")
    refusal(await http.get("/v1/policy-versions/424242"), 404, "not_found")


async def test_another_nodes_lease(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    owner, thief = NodeIdentity.generate(), NodeIdentity.generate()
    task = await leased_task(harness, owner)
    await leased_task(harness, thief)
    stolen = submission_for(task).model_dump(mode="json")
    assert "another node" in refusal(await submit_raw(http, thief, stolen), 403, "forbidden")
    renewal = json.dumps({"v": 1, "lease_id": task.lease_id}).encode()
    assert "another node" in refusal(await signed_post(http, thief, "/v1/leases/renew", renewal), 403, "forbidden")


async def test_stale_policy_version(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__async_level=0)
    identity = NodeIdentity.generate()
    task = await leased_task(harness, identity)
    coordinator = harness.client(harness.coordinator)
    await coordinator.publish(signed_manifest(harness.coordinator, 1))
    await coordinator.aclose()
    async with raw_client(harness) as http:
        response = await submit_raw(http, identity, submission_for(task).model_dump(mode="json"))
    assert "stale" in refusal(response, 409, "stale_policy")


async def test_submission_signature_must_match(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    task = await leased_task(harness, identity)
    document = submission_for(task).model_dump(mode="json")
    body = json.dumps(document).encode()
    forged = sign_document(NodeIdentity.generate(), document)
    response = await signed_post(http, identity, "/v1/submissions", body, **{HEADER_SUBMISSION_SIGNATURE: forged})
    refusal(response, 401, "bad_signature")
    missing = await signed_post(http, identity, "/v1/submissions", body)
    assert "x-prime-submission-signature" in refusal(missing, 400, "malformed").lower()


async def test_incomplete_group_is_refused(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    identity = NodeIdentity.generate()
    task = await leased_task(harness, identity)
    full = submission_for(task)
    document = submission_for(task, rollouts=full.rollouts[:-1]).model_dump(mode="json")
    assert "missing" in refusal(await submit_raw(http, identity, document), 400, "malformed")
    doubled = submission_for(task, rollouts=[*full.rollouts, full.rollouts[0]]).model_dump(mode="json")
    assert "twice" in refusal(await submit_raw(http, identity, doubled), 400, "malformed")


async def test_unregistered_node_and_unknown_submission(harness: LedgerHarness, http: httpx.AsyncClient) -> None:
    stranger = NodeIdentity.generate()
    assert "not registered" in refusal(await signed_post(http, stranger, "/v1/leases", LEASE_BODY), 403, "forbidden")
    validator = await harness.validator()
    verdict = json.dumps({"v": 1, "submission_id": "s-nope", "accepted": True}).encode()
    response = await signed_post(http, validator.identity, "/v1/verdicts", verdict)
    assert "s-nope" in refusal(response, 404, "not_found")
    await validator.aclose()


async def test_unknown_route_and_method(http: httpx.AsyncClient) -> None:
    refusal(await http.get("/v1/nothing-here"), 404, "not_found")
    refusal(await http.delete("/v1/status"), 405, "method_not_allowed")


async def test_node_rate_limit(make_harness: MakeHarness) -> None:
    harness = make_harness(api__node_burst=3, api__node_rate_per_s=0.01)
    worker = await harness.worker()
    statuses = []
    async with raw_client(harness) as http:
        for _ in range(4):
            statuses.append((await signed_post(http, worker.identity, "/v1/leases", LEASE_BODY)).status_code)
        limited = await signed_post(http, worker.identity, "/v1/leases", LEASE_BODY)
        # Another node is not slowed down by this one.
        other = await harness.worker()
        assert (await signed_post(http, other.identity, "/v1/leases", LEASE_BODY)).status_code == 200
    assert statuses[:2] == [200, 200] and statuses[2:] == [429, 429]  # register took the first token
    assert "retry in" in refusal(limited, 429, "rate_limited")
    assert int(limited.headers["Retry-After"]) >= 1
    await worker.aclose()
    await other.aclose()


async def test_ip_rate_limit(make_harness: MakeHarness) -> None:
    harness = make_harness(api__ip_burst=5, api__ip_rate_per_s=0.01)
    async with raw_client(harness) as http:
        statuses = [(await http.get("/v1/status")).status_code for _ in range(6)]
        assert statuses == [200] * 5 + [429]
        assert (await http.get("/healthz")).status_code == 200  # probes are not metered
        refusal(await http.get("/v1/status"), 429, "rate_limited")
