"""Door checks against a real coordinator process: untrusted numbers, and claims the ledger checks itself.

One `prime-coordinator start` on 127.0.0.1 (tests/support/network.py) with the tiny policy
(vocabulary of 1024, read from its config.json); nodes with real keys send signed requests over
HTTP, hand-made where the client would refuse to build them
(:func:`tests.support.malicious_worker.signed_post`). A NaN or infinite logprob is a 400
naming the field, a NaN reward is refused and cannot wedge the submission it was meant for, an
infinite tokens/s is never stored, and an empty completion, a logprob above 0 or a token id
outside the vocabulary is refused at the door and counted against the worker.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.errors import PrimeError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import Dashboard, ErrorBody, Event, EventPage, LeaseRequest, SubmitRequest, Task, Verdict
from tests.support.ledger_helpers import register_request, submission_for
from tests.support.malicious_worker import signed_post
from tests.support.network import Network, running_network

pytestmark = pytest.mark.slow


CLAIM_S = 1.0
"""How long a validator's hand-out keeps a submission from the others here (validation.hand_out_claim_s)."""


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    sections: dict[str, dict[str, Any]] = {
        "trust": {"ban_after_rejections": 1000},
        "scheduling": {"lease_ttl_s": 120},
        "validation": {"hand_out_claim_s": CLAIM_S},
    }
    root: Path = tmp_path_factory.mktemp("door-checks")
    with running_network(root, sections=sections) as network:
        yield network


async def leased(ledger: LedgerClient) -> Task:
    for _ in range(100):
        answer = await ledger.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))
        if answer.tasks:
            return answer.tasks[0]
        await asyncio.sleep(answer.retry_after_s)
    raise AssertionError("no task leased")


def refusal(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = ErrorBody.model_validate_json(response.content)
    assert body.error == code, body
    return body.detail


def node_stats(net: Network, node_id: str) -> dict[str, Any]:
    nodes = httpx.get(f"{net.url}/v1/stats", params={"limit": 10_000}, timeout=10).json()["nodes"]
    (row,) = [node for node in nodes if node["node_id"] == node_id]
    return dict(row)


def all_events(net: Network) -> list[Event]:
    """Every event through GET /v1/events (each page must read back)."""
    found: list[Event] = []
    after = 0
    while True:
        response = httpx.get(f"{net.url}/v1/events", params={"after": after, "limit": 1000}, timeout=10)
        assert response.status_code == 200, response.text
        page = EventPage.model_validate_json(response.content)
        if not page.events:
            return found
        found += page.events
        after = page.next_after


def test_non_finite_logprobs_are_a_400_naming_the_field(net: Network) -> None:
    async def attack() -> tuple[list[httpx.Response], str]:
        identity = NodeIdentity.generate()
        async with LedgerClient(net.url, identity) as ledger:
            await ledger.register(register_request())
            task = await leased(ledger)
            answers = []
            for bad in (math.nan, math.inf, -math.inf):
                document = submission_for(task).model_dump(mode="json")
                document["rollouts"][0]["logprobs"][1] = bad
                answers.append(await signed_post(net.url, identity, "/v1/submissions", document))
            return answers, (await ledger.submit(submission_for(task))).status  # the lease is still good

    answers, status = asyncio.run(attack())
    for response in answers:
        assert "rollouts.0.logprobs.1" in refusal(response, 400, "malformed")
        assert "finite" in response.text
    assert status == "pending"


def test_a_nan_reward_verdict_is_refused_and_cannot_wedge_the_submission(net: Network) -> None:
    async def attack() -> tuple[httpx.Response, str, httpx.Response]:
        async with LedgerClient(net.url, NodeIdentity.generate()) as worker:
            await worker.register(register_request())
            task = await leased(worker)
            request = submission_for(task)
            submission_id = (await worker.submit(request)).submission_id
        num_rollouts = len(request.rollouts)
        evil = NodeIdentity.generate()
        async with LedgerClient(net.url, evil) as ledger:
            await ledger.register(register_request("validator"))
            await ledger.pending(limit=256)  # handed out: its verdicts count (as an approved validator's do)
        verdict: dict[str, object] = {"v": 1, "submission_id": submission_id, "accepted": True, "reasons": []}
        nan_rewards = {**verdict, "rewards": [math.nan] * num_rollouts}
        nan_verdict = await signed_post(net.url, evil, "/v1/verdicts", nan_rewards)
        async with LedgerClient(net.url, NodeIdentity.generate()) as honest:
            await honest.register(register_request("validator"))
            await asyncio.sleep(CLAIM_S + 0.2)  # the refused validator's claim on it lapses: it is shared again
            await honest.pending(limit=256)
            decided = await honest.post_verdict(
                Verdict(submission_id=submission_id, accepted=True, rewards=[0.5] * num_rollouts)
            )
        # The refused validator's honest retry is answered too (the submission is decided), never a 5xx.
        retry = await signed_post(net.url, evil, "/v1/verdicts", {**verdict, "rewards": [0.5] * num_rollouts})
        return nan_verdict, decided.status, retry

    nan_verdict, status, retry = asyncio.run(attack())
    assert "rewards.0" in refusal(nan_verdict, 400, "malformed")
    assert status == "accepted"
    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "accepted"
    all_events(net)


def test_an_infinite_tokens_per_s_heartbeat_is_refused_and_never_stored(net: Network) -> None:
    identity = NodeIdentity.generate()

    async def attack() -> list[httpx.Response]:
        async with LedgerClient(net.url, identity) as ledger:
            await ledger.register(register_request())
        answers = []
        for bad in (math.inf, math.nan, 1e300, -1.0):
            heartbeat = {"v": 1, "policy_versions_held": [0], "tokens_per_s": bad}
            answers.append(await signed_post(net.url, identity, "/v1/nodes/heartbeat", heartbeat))
        return answers

    for response in asyncio.run(attack()):
        assert "tokens_per_s" in refusal(response, 400, "malformed")
    response = httpx.get(f"{net.url}/v1/dashboard", timeout=30)
    assert response.status_code == 200, response.text
    (node,) = [n for n in Dashboard.model_validate_json(response.content).nodes if n.node_id == identity.node_id]
    assert node.tokens_per_s == 0.0


def test_claims_checkable_at_the_door_are_refused_and_counted(net: Network) -> None:
    def positive_logprob(rollout: dict[str, Any]) -> None:
        rollout["logprobs"][2] = 0.5

    def token_outside_vocabulary(rollout: dict[str, Any]) -> None:
        rollout["completion_ids"][0] = 5000  # the tiny policy's vocabulary is 1024 tokens

    def empty_completion(rollout: dict[str, Any]) -> None:
        rollout.update(completion_ids=[], logprobs=[])

    def episode_in_a_single_turn_run(rollout: dict[str, Any]) -> None:
        turn = {key: rollout[key] for key in ("completion_ids", "logprobs", "finish_reason", "proof_b64")}
        rollout["later_turns"] = [turn]

    cheats: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (positive_logprob, "logprobs[2] is 0.5, above 0"),
        (episode_in_a_single_turn_run, "2 policy turns, but this run's episodes have at most 1 (its environment is"),
        (token_outside_vocabulary, "completion_ids holds token id 5000, outside the policy's vocabulary [0, 1024)"),
        (empty_completion, "completion_ids is empty"),
    ]
    identity = NodeIdentity.generate()

    async def attack() -> tuple[list[PrimeError], httpx.Response, str]:
        refusals = []
        async with LedgerClient(net.url, identity) as ledger:
            await ledger.register(register_request())
            task = await leased(ledger)
            for cheat, _reason in cheats:
                document = submission_for(task).model_dump(mode="json")
                cheat(document["rollouts"][1])
                try:
                    await ledger.submit(SubmitRequest.model_validate(document))
                except PrimeError as exc:
                    refusals.append(exc)
            absurd = submission_for(task).model_dump(mode="json")
            absurd["rollouts"][0]["logprobs"][0] = -1e30
            absurd_answer = await signed_post(net.url, identity, "/v1/submissions", absurd)
            return refusals, absurd_answer, (await ledger.submit(submission_for(task))).status

    refusals, absurd_answer, status = asyncio.run(attack())
    assert len(refusals) == len(cheats), refusals
    for refused, (_cheat, reason) in zip(refusals, cheats, strict=True):
        assert refused.status_code == 400 and f"rollout 1: {reason}" in refused.message, refused.message
    assert "rollouts.0.logprobs.0" in refusal(absurd_answer, 400, "malformed")  # a schema error: not counted
    assert status == "pending"
    assert node_stats(net, identity.node_id)["num_rejected"] == len(cheats)
    violations = [e for e in all_events(net) if e.kind == "violation" and e.node_id == identity.node_id]
    assert [str(e.data["reason"]) for e in violations] == [refused.message for refused in refusals]
