"""The ledger client maps answers back to protocol errors and signs what it sends (MockTransport)."""

from __future__ import annotations

import httpx
import pytest

from protocol.errors import RateLimitedError, RemoteUnavailableError, StalePolicyError
from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE, LedgerClient
from protocol.schemas import LeaseRequest, SubmitRequest
from protocol.signing import MemoryReplayCache, verify_document, verify_request

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def client_answering(handler: httpx.MockTransport) -> LedgerClient:
    return LedgerClient("http://ledger", NodeIdentity.generate(), transport=handler)


async def test_refusals_become_the_same_error_class() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/leases":
            return httpx.Response(
                429, json={"v": 1, "error": "rate_limited", "detail": "slow down"}, headers={"Retry-After": "7"}
            )
        return httpx.Response(409, json={"v": 1, "error": "stale_policy", "detail": "policy 1 is stale"})

    async with client_answering(httpx.MockTransport(handler)) as client:
        with pytest.raises(RateLimitedError) as limited:
            await client.lease(LeaseRequest())
        assert limited.value.retry_after_s == 7.0
        with pytest.raises(StalePolicyError, match="policy 1 is stale"):
            await client.renew("l-1")


async def test_server_errors_and_unreachable_ledger_are_unavailable() -> None:
    async with client_answering(httpx.MockTransport(lambda _: httpx.Response(502, text="bad gateway"))) as client:
        with pytest.raises(RemoteUnavailableError, match="502"):
            await client.status()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client_answering(httpx.MockTransport(refuse)) as client:
        with pytest.raises(RemoteUnavailableError, match="unreachable"):
            await client.status()


async def test_submission_carries_request_and_document_signatures() -> None:
    seen: list[str] = []
    cache = MemoryReplayCache()

    def handler(request: httpx.Request) -> httpx.Response:
        verified = verify_request(
            request.method, request.url.raw_path.decode(), request.content, request.headers, cache
        )
        document = SubmitRequest.model_validate_json(request.content).model_dump(mode="json")
        verify_document(verified.node_id, document, request.headers[HEADER_SUBMISSION_SIGNATURE])
        seen.append(verified.node_id)
        return httpx.Response(200, json={"v": 1, "submission_id": "s-1", "status": "pending", "duplicate": False})

    async with client_answering(httpx.MockTransport(handler)) as client:
        submission = SubmitRequest.model_validate(
            {
                "lease_id": "l-1",
                "task_id": "t0",
                "policy_version": 0,
                "engine": "hf",
                "rollouts": [
                    {
                        "prompt_index": 0,
                        "sample_index": 0,
                        "completion_ids": [1],
                        "logprobs": [-0.1],
                        "finish_reason": "stop",
                        "proof_b64": "",
                    }
                ],
            }
        )
        answer = await client.submit(submission)
    assert answer.submission_id == "s-1" and seen == [client.identity.node_id]
