"""A malicious worker for integration tests: a node that speaks the public protocol and tries every cheat.

It registers like any worker (:class:`protocol.ledger_client.LedgerClient`, or raw httpx where
the client would refuse to send junk) and then, one attack at a time, records how each was
answered: a refusal at the door (status and reason) or a submission id for the validators to
judge. Door attacks: a request in another node's name signed with its own key, an honest
worker's accepted submission replayed under that worker's lease and copied under a fresh lease
of its own, a policy version it never had, an inflated reward field, a wrong task id. Proof
attacks: those of :mod:`tests.support.adversary` that need only the policy itself. Attacks live
RL networks have met (:meth:`Attacker.declared_split_attacks`, :meth:`Attacker.termination_attacks`,
:meth:`Attacker.earlier_lease_attacks`): a worker-declared prompt/completion split, mask or second copy of
the tokens; filler after EOS and EOS suppressed to the cap; rollouts generated for an abandoned lease
submitted under the task's next lease, by a second identity or by the same one. :func:`signed_post`
sends any hand-made body signed with a node's key, NaN and Infinity literals included (the
number attacks of tests/integration/test_door_checks.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engines.hf import HFEngine
from node.startup import eos_token_ids
from protocol.errors import ForbiddenError, PrimeError
from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE, LedgerClient
from protocol.schemas import Hardware, LeaseRequest, RegisterRequest, SubmitRequest, Task
from protocol.signing import HEADER_NODE, sign_document, sign_request
from tests.support.adversary import (
    altered_prompt,
    altered_token,
    eos_suppressed,
    flipped_signs,
    has_early_eos,
    honest_claims,
    other_temperature,
    padded_after_eos,
    sample_tasks_of,
    submission_of,
    truncated_claimed_finished,
)
from tests.support.tiny_model import TINY_EOS_TOKEN_ID
from toploc.verify import Claim, SampleTask

ProofAttack = Callable[[HFEngine, Sequence[SampleTask]], list[Claim]]

PROOF_ATTACKS: dict[str, ProofAttack] = {
    "altered_completion_token": lambda policy, tasks: altered_token(policy, tasks),
    "flipped_signs": lambda policy, tasks: flipped_signs(policy, tasks),
    "other_temperature_half": lambda policy, tasks: other_temperature(policy, tasks, 0.5),
    "greedy_as_sampling": lambda policy, tasks: other_temperature(policy, tasks, 1e-4),
    "altered_prompt_token": lambda policy, tasks: altered_prompt(policy, tasks),
    "truncated_claimed_finished": lambda policy, tasks: truncated_claimed_finished(policy, tasks),
}


DECLARED_FIELDS: dict[str, tuple[str, object]] = {
    "declared_prompt_ids": ("prompt_ids", [2, 3, 4]),
    "declared_loss_mask": ("loss_mask", [1]),
    "declared_prompt_length": ("num_prompt_tokens", 0),
    "declared_completion_text": ("text", "the answer"),
    "declared_split_for_the_group": ("prompt_lengths", [0]),
}
"""A second copy of the tokens, a mask or a prompt/completion split a worker might declare: attack name ->
(field, value); ``prompt_lengths`` is put on the submission, the others on its first rollout."""
TERMINATION_ATTACKS = ("padded_after_eos", "eos_suppressed")
EARLIER_LEASE_ATTACKS = ("earlier_lease_by_another_identity", "earlier_lease_by_the_same_identity")
EOS = (TINY_EOS_TOKEN_ID,)
MAX_TRIES = 8
LEASE_BACK_WAIT_S = 10.0
NOT_LEASED_BACK = "the task never came back to a node that held it"
"""The outcome of an earlier-lease attack whose task the ledger would not lease to the attacker again."""


@dataclass
class Outcome:
    """How one attack was answered: ``status`` of a door refusal, or the submission id it got."""

    attack: str
    status: int | None = None
    reason: str = ""
    submission_id: str | None = None


@dataclass
class Attacker:
    url: str
    policy: HFEngine
    identity: NodeIdentity = field(default_factory=NodeIdentity.generate)
    outcomes: list[Outcome] = field(default_factory=list)
    eos: tuple[int, ...] = EOS
    """Every end token the policy's files name, as honest workers and validators take them (node.startup)."""

    async def register(self, ledger: LedgerClient) -> None:
        hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=2**30)
        await ledger.register(RegisterRequest(role="worker", hardware=hardware, engine="hf", software_version="evil"))

    async def lease(self, ledger: LedgerClient) -> Task:
        while True:
            leased = await ledger.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))
            if leased.tasks:
                return leased.tasks[0]
            await asyncio.sleep(0.2)

    async def submit(self, ledger: LedgerClient, attack: str, request: SubmitRequest) -> Outcome:
        try:
            outcome = Outcome(attack, submission_id=(await ledger.submit(request)).submission_id)
        except PrimeError as exc:
            outcome = Outcome(attack, status=exc.status_code, reason=exc.message)
        self.outcomes.append(outcome)
        return outcome

    async def post_raw(self, attack: str, path: str, document: dict[str, object], as_node: str | None = None) -> None:
        """POST a hand-made body signed with this key (``as_node``: claiming to be that node)."""
        response = await signed_post(self.url, self.identity, path, document, as_node)
        self.outcomes.append(Outcome(attack, status=response.status_code, reason=response.text[:300]))

    async def door_attacks(self, ledger: LedgerClient, honest_id: str, honest: SubmitRequest) -> None:
        """Everything the ledger should refuse, or that a validator must reject, short of a proof attack."""
        await self.post_raw("forged_signature", "/v1/leases", LeaseRequest().model_dump(mode="json"), as_node=honest_id)
        await self.submit(ledger, "replay_same_lease", honest)
        fresh = await self.lease(ledger)
        copy = honest.model_copy(update={"lease_id": fresh.lease_id, "task_id": fresh.task_id})
        await self.submit(ledger, "replay_under_new_lease", copy)
        task = await self.lease(ledger)
        mine = submission_of(task, honest_claims(self.policy, sample_tasks_of(task, (TINY_EOS_TOKEN_ID,))))
        await self.submit(ledger, "policy_version_never_had", mine.model_copy(update={"policy_version": 1}))
        inflated = mine.model_dump(mode="json")
        inflated["rollouts"][0]["reward"] = 1e9
        await self.post_raw("inflated_reward", "/v1/submissions", inflated)
        await self.submit(ledger, "wrong_task_id", mine.model_copy(update={"task_id": fresh.task_id}))
        await ledger.abandon(task.lease_id)

    async def declared_split_attacks(self, ledger: LedgerClient) -> None:
        """An honest group sent with each worker-declared field (all refused), then as it is (the control)."""
        task = await self.lease(ledger)
        mine = submission_of(task, honest_claims(self.policy, sample_tasks_of(task, self.eos)))
        for name, (field_name, value) in DECLARED_FIELDS.items():
            document = mine.model_dump(mode="json")
            target = document if field_name == "prompt_lengths" else document["rollouts"][0]
            target[field_name] = value
            await self.post_raw(name, "/v1/submissions", document)
        await self.submit(ledger, "honest_control", mine)

    async def termination_attacks(self, ledger: LedgerClient) -> None:
        """Filler after the first EOS and EOS suppressed to the cap, each on a group where the policy stops early.

        The attacker generates honestly first and keeps only a task on which some sample draws EOS before the
        cap (it abandons the others): on any other task both attacks are the honest rollout."""
        passed_over: list[Task] = []
        for name in TERMINATION_ATTACKS:
            for _ in range(MAX_TRIES):
                task = await self.lease(ledger)
                samples = sample_tasks_of(task, self.eos)
                honest = honest_claims(self.policy, samples)
                if any(c.finish_reason == "stop" and len(c.completion_ids) < task.sampling.max_tokens for c in honest):
                    break
                passed_over.append(task)  # held, not abandoned: the next lease is another task
            else:
                raise AssertionError(f"no task in {MAX_TRIES} on which the policy stops before the cap")
            if name == "padded_after_eos":
                claims = padded_after_eos(self.policy, samples, whole_group=True)
                assert any(has_early_eos(c) for c in claims)
            else:
                claims = eos_suppressed(self.policy, samples)
            await self.submit(ledger, name, submission_of(task, claims))
        for task in passed_over:
            await ledger.abandon(task.lease_id)

    async def earlier_lease_attacks(self, ledger: LedgerClient, sybil: LedgerClient) -> None:
        """Generate honestly for a lease, abandon it (as a worker keeping only the groups it likes does), and
        submit those rollouts under the task's next lease: taken by a second identity, then by the same one."""
        for name, next_holder in zip(EARLIER_LEASE_ATTACKS, (sybil, ledger), strict=True):
            task = await self.lease(ledger)
            claims = honest_claims(self.policy, sample_tasks_of(task, self.eos))
            await ledger.abandon(task.lease_id)
            others: list[Task] = []  # other re-queued tasks may come first: held until the target comes back
            again: Task | None = None
            while again is None and len(others) < MAX_TRIES:
                try:  # the ledger never hands a task back to a node that held it: that wait ends here
                    leased = await asyncio.wait_for(self.lease(next_holder), timeout=LEASE_BACK_WAIT_S)
                except TimeoutError:
                    break
                if leased.task_id == task.task_id:
                    again = leased
                else:
                    others.append(leased)
            if again is None:
                self.outcomes.append(Outcome(name, reason=NOT_LEASED_BACK))
            else:
                await self.submit(next_holder, name, submission_of(again, claims))
            for other in others:
                await next_holder.abandon(other.lease_id)

    async def proof_attacks(self, ledger: LedgerClient, names: Sequence[str] = tuple(PROOF_ATTACKS)) -> None:
        for name in names:
            task = await self.lease(ledger)
            claims = PROOF_ATTACKS[name](self.policy, sample_tasks_of(task, (TINY_EOS_TOKEN_ID,)))
            await self.submit(ledger, name, submission_of(task, claims))

    async def wait_for_ban(self, ledger: LedgerClient, timeout_s: float) -> str:
        """The ban reason, once the ledger refuses this node."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                await ledger.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))
            except ForbiddenError as exc:
                return exc.message
            await asyncio.sleep(1)
        raise AssertionError(f"the attacker was never banned; outcomes: {self.outcomes}")


async def signed_post(
    url: str, identity: NodeIdentity, path: str, document: dict[str, object], as_node: str | None = None
) -> httpx.Response:
    """POST ``document`` as raw JSON (NaN and Infinity written as Python writes them), the request signed with
    ``identity`` (``as_node``: claiming to be that node) and carrying its submission signature; a document
    with NaN has no canonical JSON, so then the submission signature is junk (the schema refuses it first)."""
    content = json.dumps(document).encode()
    try:
        document_signature = sign_document(identity, document)
    except ValueError:
        document_signature = "A" * 88
    headers = {
        "Content-Type": "application/json",
        HEADER_SUBMISSION_SIGNATURE: document_signature,
        **sign_request(identity, "POST", path, content),
    }
    if as_node is not None:
        headers[HEADER_NODE] = as_node
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return await http.post(path, content=content, headers=headers)


async def attack_until_banned(url: str, checkpoint: Path, honest_id: str, honest: SubmitRequest) -> Attacker:
    """Run every attack against the network at ``url``, then wait for the ban."""
    attacker = Attacker(url, HFEngine(checkpoint, max_batch_size=16))
    async with LedgerClient(url, attacker.identity) as ledger:
        await attacker.register(ledger)
        await attacker.door_attacks(ledger, honest_id, honest)
        await attacker.proof_attacks(ledger)
        await attacker.wait_for_ban(ledger, 300)
    return attacker


async def attack_as_rl_networks_were(url: str, checkpoint: Path) -> Attacker:
    """The attacks live RL networks have met, from one identity and a second one it controls."""
    attacker = Attacker(url, HFEngine(checkpoint, max_batch_size=16), eos=eos_token_ids(checkpoint))
    sybil = Attacker(url, attacker.policy, eos=attacker.eos)
    async with LedgerClient(url, attacker.identity) as ledger, LedgerClient(url, sybil.identity) as second:
        await attacker.register(ledger)
        await sybil.register(second)
        await attacker.declared_split_attacks(ledger)
        await attacker.termination_attacks(ledger)
        await attacker.earlier_lease_attacks(ledger, second)
    return attacker
