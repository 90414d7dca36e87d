"""Refusals at the door that only a cheat earns count against the signer; forgeries and honest races do not.

On SQLite and PostgreSQL: a submission for another node's lease, for the wrong task or policy
version, or changing an earlier submission is refused (4xx with a reason) and counted like a
rejection, up to a ban; the same signed request replayed is refused without counting twice;
a request signed by another key in a node's name is refused 401 and changes nothing for that
node; a body with an extra (reward) field is refused as malformed.
"""

from __future__ import annotations

import json

import httpx
import pytest

from protocol.errors import ConflictError, ForbiddenError, ProtocolError
from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE, LedgerClient
from protocol.schemas import LeaseRequest, NodeStats
from protocol.signing import HEADER_NODE, sign_document, sign_request
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio


async def node_stats(client: LedgerClient, node_id: str) -> NodeStats:
    (row,) = [node for node in (await client.stats()).nodes if node.node_id == node_id]
    return row


async def test_cheats_at_the_door_are_counted_and_ban(make_harness: MakeHarness) -> None:
    harness = make_harness(trust__ban_after_rejections=4, scheduling__max_leases_per_node=4)
    cheat, honest = await harness.worker(), await harness.worker()
    (theirs,) = (await honest.lease(LeaseRequest())).tasks
    mine = (await cheat.lease(LeaseRequest(max_tasks=3))).tasks
    with pytest.raises(ForbiddenError, match="belongs to another node"):
        await cheat.submit(submission_for(theirs))
    with pytest.raises(ConflictError, match="is for task"):
        await cheat.submit(submission_for(mine[0], task_id=mine[1].task_id))
    with pytest.raises(ConflictError, match="is for policy version 0, not 7"):
        await cheat.submit(submission_for(mine[0], policy_version=7))
    assert (await node_stats(cheat, cheat.identity.node_id)).num_rejected == 3
    assert (await cheat.submit(submission_for(mine[0]))).status == "pending"
    with pytest.raises(ConflictError, match="other content"):
        await cheat.submit(submission_for(mine[0], engine="vllm"))
    row = await node_stats(honest, cheat.identity.node_id)
    assert row.banned and row.num_rejected == 4 and "refused at the door" in (row.ban_reason or "")
    with pytest.raises(ForbiddenError, match="banned"):
        await cheat.lease(LeaseRequest())
    assert (await node_stats(honest, honest.identity.node_id)).num_rejected == 0
    kinds = [event.kind for event in (await honest.events(limit=1000)).events]
    assert (kinds.count("violation"), kinds.count("ban")) == (4, 1)
    await cheat.aclose()
    await honest.aclose()


async def test_a_replayed_request_is_refused_and_counted_once(harness: LedgerHarness, worker: LedgerClient) -> None:
    tasks = (await worker.lease(LeaseRequest(max_tasks=2))).tasks
    body = submission_for(tasks[0], task_id=tasks[1].task_id)
    content = json.dumps(body.model_dump(mode="json")).encode()
    headers = {
        "Content-Type": "application/json",
        HEADER_SUBMISSION_SIGNATURE: sign_document(worker.identity, body.model_dump(mode="json")),
        **sign_request(worker.identity, "POST", "/v1/submissions", content),
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger") as http:
        first = await http.post("/v1/submissions", content=content, headers=headers)
        again = await http.post("/v1/submissions", content=content, headers=headers)
    assert first.status_code == 409 and "is for task" in first.json()["detail"]
    assert again.status_code == 401 and "replayed" in again.json()["detail"]
    assert (await node_stats(worker, worker.identity.node_id)).num_rejected == 1


async def test_a_forged_signature_is_refused_and_does_not_touch_the_impersonated_node(
    harness: LedgerHarness, worker: LedgerClient
) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    forger = NodeIdentity.generate()
    body = submission_for(task, task_id="t-999")  # would be a counted cheat if the worker had signed it
    content = json.dumps(body.model_dump(mode="json")).encode()
    headers = {
        "Content-Type": "application/json",
        HEADER_SUBMISSION_SIGNATURE: sign_document(forger, body.model_dump(mode="json")),
        **sign_request(forger, "POST", "/v1/submissions", content),
        HEADER_NODE: worker.identity.node_id,
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger") as http:
        response = await http.post("/v1/submissions", content=content, headers=headers)
    assert response.status_code == 401 and response.json()["error"].endswith("signature")
    row = await node_stats(worker, worker.identity.node_id)
    assert (row.num_rejected, row.banned) == (0, False)
    assert (await worker.submit(submission_for(task))).status == "pending"


async def test_an_inflated_reward_field_is_refused_as_malformed(harness: LedgerHarness, worker: LedgerClient) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    document = submission_for(task).model_dump(mode="json")
    document["rollouts"][0]["reward"] = 1e9
    content = json.dumps(document).encode()
    headers = {
        "Content-Type": "application/json",
        HEADER_SUBMISSION_SIGNATURE: sign_document(worker.identity, document),
        **sign_request(worker.identity, "POST", "/v1/submissions", content),
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger") as http:
        response = await http.post("/v1/submissions", content=content, headers=headers)
    assert response.status_code == 400 and response.json()["error"] == "malformed"
    assert "reward" in response.json()["detail"]
    with pytest.raises(ProtocolError):  # the client's own schema refuses it too
        await worker.submit(submission_for(task).model_copy(update={"rollouts": []}))
