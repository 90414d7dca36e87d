"""Auditing submissions: honest groups pass; forged, rebound and cheated groups are rejected with reasons."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from engines.hf import HFEngine
from protocol.identity import NodeIdentity
from protocol.schemas import PendingSubmission, Task
from protocol.signing import sign_document
from tests.support.adversary import (
    altered_token,
    flipped_signs,
    honest_claims,
    other_temperature,
    sample_tasks_of,
    signed_pending,
    submission_of,
)
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, save_tiny_qwen2
from toploc.verify import Claim, SampleTask
from validator.audit import audit_submission, mostly_unrecomputed

EOS = (TINY_EOS_TOKEN_ID,)
PROMPTS = [[5, 9, 33, 12], [7, 7, 7, 8, 100]]
GROUP_SIZE = 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> HFEngine:
    return HFEngine(save_tiny_qwen2(tmp_path_factory.mktemp("policy") / "m", seed=3), max_batch_size=8)


def make_task() -> Task:
    return Task.model_validate(
        {
            "task_id": "t-1",
            "lease_id": "l-1",
            "task_name": "test",
            "prompts": [{"prompt_index": i, "token_ids": p} for i, p in enumerate(PROMPTS)],
            "group_size": GROUP_SIZE,
            "sampling": {"temperature": 1.0, "max_tokens": 40},
            "policy_version": 3,
            "sampling_seed": 4242,
            "deadline": time.time() + 60,
        }
    )


def sample_tasks(task: Task) -> list[SampleTask]:
    return sample_tasks_of(task, EOS)


def pending(task: Task, claims: list[Claim], worker: NodeIdentity, **changes: object) -> PendingSubmission:
    return signed_pending(task, submission_of(task, claims).model_copy(update=changes), worker)


def test_honest_group_is_accepted(policy: HFEngine) -> None:
    task = make_task()
    verdict, rollouts = audit_submission(
        pending(task, honest_claims(policy, sample_tasks(task)), NodeIdentity.generate()), policy, EOS
    )
    assert verdict.accepted, verdict.reasons
    assert len(rollouts) == len(PROMPTS) * GROUP_SIZE


def test_forged_signature_is_rejected(policy: HFEngine) -> None:
    task = make_task()
    item = pending(task, honest_claims(policy, sample_tasks(task)), NodeIdentity.generate())
    forged = item.model_copy(update={"worker_id": NodeIdentity.generate().node_id})
    verdict, _ = audit_submission(forged, policy, EOS)
    assert not verdict.accepted and verdict.reasons[0].startswith("signature:")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [({"task_id": "t-2"}, "task:"), ({"lease_id": "l-9"}, "task:"), ({"policy_version": 2}, "policy:")],
)
def test_submission_bound_to_another_task_is_rejected(
    policy: HFEngine, changes: dict[str, object], reason: str
) -> None:
    task = make_task()
    item = pending(task, honest_claims(policy, sample_tasks(task)), NodeIdentity.generate(), **changes)
    verdict, _ = audit_submission(item, policy, EOS)
    assert not verdict.accepted and any(r.startswith(reason) for r in verdict.reasons), verdict.reasons


Cheat = Callable[[HFEngine, list[SampleTask]], list[Claim]]


@pytest.mark.parametrize(
    "cheat",
    [
        lambda policy, tasks: altered_token(policy, tasks),
        lambda policy, tasks: flipped_signs(policy, tasks),
        lambda policy, tasks: other_temperature(policy, tasks, 0.5),
    ],
    ids=["altered_token", "flipped_signs", "half_temperature"],
)
def test_cheated_rollouts_reject_the_group(policy: HFEngine, cheat: Cheat) -> None:
    task = make_task()
    claims = cheat(policy, sample_tasks(task))
    verdict, rollouts = audit_submission(pending(task, claims, NodeIdentity.generate()), policy, EOS)
    assert not verdict.accepted
    assert all(reason.startswith("rollout p") for reason in verdict.reasons)
    assert any(not r.accepted for r in rollouts)


def test_junk_proof_and_unknown_prompt_are_reasons_not_crashes(policy: HFEngine) -> None:
    task = make_task()
    item = pending(task, honest_claims(policy, sample_tasks(task)), NodeIdentity.generate())
    bad = item.submission.rollouts[0].model_copy(update={"proof_b64": "***", "prompt_index": 0})
    worse = item.submission.rollouts[1].model_copy(update={"prompt_index": 7})
    submission = item.submission.model_copy(update={"rollouts": [bad, worse, *item.submission.rollouts[2:]]})
    worker = NodeIdentity.generate()
    item = item.model_copy(
        update={
            "submission": submission,
            "worker_id": worker.node_id,
            "worker_signature_b64": sign_document(worker, submission.model_dump(mode="json")),
        }
    )
    verdict, _ = audit_submission(item, policy, EOS)
    assert not verdict.accepted
    assert any("not valid base64" in r for r in verdict.reasons)
    assert any("no prompt 7" in r for r in verdict.reasons)


def test_rewards_are_recomputed_from_the_environment_not_taken_from_the_worker() -> None:
    from transformers import AutoTokenizer

    from environments.builtin import builtin_environment
    from environments.prompts import EnvironmentPrompts
    from node.startup import eos_token_ids
    from trainer.resolve import resolve_model_path
    from validator.audit import environment_reward_fn

    checkpoint = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    eos = eos_token_ids(checkpoint)
    engine = HFEngine(checkpoint, max_batch_size=8)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    reverse_text = builtin_environment("reverse_text")
    source = EnvironmentPrompts(reverse_text, tokenizer).prompt_group(5, 2)
    task = make_task().model_copy(
        update={
            "task_name": "reverse_text",
            "prompts": [
                make_task()
                .prompts[0]
                .model_copy(
                    update={"prompt_index": i, "token_ids": list(p.token_ids), "example_index": p.example_index}
                )
                for i, p in enumerate(source)
            ],
        }
    )
    samples = [SampleTask(s.prompt_ids, s.sampling, s.seed, s.stream, eos) for s in sample_tasks(task)]
    item = pending(task, honest_claims(engine, samples), NodeIdentity.generate())
    verdict, _ = audit_submission(item, engine, eos, reward_fn=environment_reward_fn(reverse_text, tokenizer, eos))
    assert verdict.accepted, verdict.reasons
    expected = []
    for rollout in item.submission.rollouts:
        ids = rollout.completion_ids[:-1] if rollout.completion_ids[-1] in eos else rollout.completion_ids
        example = reverse_text.example(10 + rollout.prompt_index)
        expected.append(reverse_text.reward(example, tokenizer.decode(ids, skip_special_tokens=True)))
    assert verdict.rewards == pytest.approx(expected)
    assert verdict.reward_components == {"lcs_ratio": pytest.approx(expected)}
    assert all(0.0 <= r <= 1.0 for r in verdict.rewards) and max(verdict.rewards) > 0


def test_only_the_samples_the_ledger_picked_are_recomputed(policy: HFEngine) -> None:
    task = make_task()
    samples = sample_tasks(task)
    honest = honest_claims(policy, samples)
    cheated = altered_token(policy, samples[1:2])  # sample p0/s1 cheats
    claims = [honest[0], *cheated, *honest[2:]]
    item = pending(task, claims, NodeIdentity.generate())
    skipped = item.model_copy(update={"audit_sample_indices": [0, 3]})
    verdict, rollouts = audit_submission(skipped, policy, EOS)
    assert verdict.accepted and len(rollouts) == 2  # the cheat was not among the audited samples
    caught = item.model_copy(update={"audit_sample_indices": [1]})
    verdict, rollouts = audit_submission(caught, policy, EOS)
    assert not verdict.accepted and len(rollouts) == 1
    assert all(reason.startswith("rollout p0/s1:") for reason in verdict.reasons)


def test_a_batch_of_low_shares_is_mostly_unrecomputed() -> None:
    task = make_task()
    worker = NodeIdentity.generate()
    claims = [Claim(t, [1], [0.0], "length", b"") for t in sample_tasks(task)]  # 4 samples; nothing is recomputed
    whole = pending(task, claims, worker)
    one = whole.model_copy(update={"audit_sample_indices": [2]})
    assert mostly_unrecomputed([one]) and mostly_unrecomputed([one, one])
    assert not mostly_unrecomputed([whole])  # none named: all recomputed
    assert not mostly_unrecomputed([one, whole])  # 5 of 8
    assert not mostly_unrecomputed([whole.model_copy(update={"audit_sample_indices": [0, 3]})])  # half


def test_checks_without_a_model_run_on_every_sample(policy: HFEngine) -> None:
    task = make_task()
    claims = honest_claims(policy, sample_tasks(task))
    lying = claims[2]
    claims[2] = Claim(lying.task, lying.completion_ids, lying.logprobs[:-1], lying.finish_reason, lying.proof)
    item = pending(task, claims, NodeIdentity.generate()).model_copy(update={"audit_sample_indices": [0]})
    verdict, rollouts = audit_submission(item, policy, EOS)
    assert not verdict.accepted and rollouts == []
    assert any(reason.startswith("rollout p1/s0: shape:") for reason in verdict.reasons), verdict.reasons


def test_one_batch_across_submissions_gives_each_its_own_verdict(policy: HFEngine) -> None:
    from validator.audit import audit_submissions

    tasks = [make_task().model_copy(update={"task_id": f"t-{i}", "sampling_seed": 100 + i}) for i in range(3)]
    items = []
    for i, task in enumerate(tasks):
        claims = honest_claims(policy, sample_tasks(task)) if i != 1 else flipped_signs(policy, sample_tasks(task))
        item = pending(task, claims, NodeIdentity.generate())
        items.append(item.model_copy(update={"submission_id": f"s-{i}"}))
    batched = audit_submissions(items, policy, EOS)
    assert [verdict.submission_id for verdict, _ in batched] == ["s-0", "s-1", "s-2"]
    assert [verdict.accepted for verdict, _ in batched] == [True, False, True]
    for item, (verdict, _) in zip(items, batched, strict=True):
        assert audit_submission(item, policy, EOS)[0] == verdict  # the same as one at a time


def test_a_submission_the_engine_cannot_recompute_is_rejected_not_fatal(policy: HFEngine) -> None:
    from validator.audit import audit_submissions_safely

    task = make_task()
    honest = pending(task, honest_claims(policy, sample_tasks(task)), NodeIdentity.generate())
    long_task = make_task().model_copy(
        update={"task_id": "t-long", "sampling": task.sampling.model_copy(update={"max_tokens": 2000})}
    )
    worker = NodeIdentity.generate()
    rollouts = [
        rollout.model_copy(update={"completion_ids": [5] * 2000, "logprobs": [-1.0] * 2000, "finish_reason": "length"})
        for rollout in honest.submission.rollouts
    ]
    submission = honest.submission.model_copy(update={"task_id": "t-long", "rollouts": rollouts})
    too_long = honest.model_copy(
        update={
            "submission_id": "s-long",
            "task": long_task,
            "submission": submission,
            "worker_id": worker.node_id,
            "worker_signature_b64": sign_document(worker, submission.model_dump(mode="json")),
        }
    )
    results = audit_submissions_safely([honest, too_long], policy, EOS)
    assert all(isinstance(result, tuple) for result in results)
    (first, _), (second, _) = [result for result in results if isinstance(result, tuple)]
    assert first.accepted, first.reasons
    assert not second.accepted and second.reasons[0].startswith("audit: the rollouts cannot be recomputed")
