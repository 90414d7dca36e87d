"""Honest and dishonest workers' rollouts, for the TOPLOC attack suite, calibration and validator tests.

A toploc.verify.SampleTask is what the ledger asks of one sample (prompt, sampling params,
seed, noise stream, EOS ids); a toploc.verify.Claim is what a worker submits for it (tokens,
logprobs, finish reason, proof bytes). :func:`honest_claims` is what a correct worker sends. Each
attack on the proof and sampling checks is a function with the same shape, and each is as strong as the
attacker can cheaply make it: wherever the attack does not need them wrong, it repairs the
proof and the logprobs with a prefill of the right model, so only the cheat itself remains.
Attacks that need a second model (another random init, the policy with 1% weight noise, the
policy in a lower precision than the run's) take it as an engine.
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

import torch

from engines.base import Engine, GenerationRequest, GenerationResult
from engines.hf import HFEngine
from protocol.identity import NodeIdentity
from protocol.schemas import PendingSubmission, Rollout, SubmitRequest, Task
from protocol.signing import sign_document
from toploc.proof import build_proofs
from toploc.sampling import sample_stream, stream_indices
from toploc.verify import Claim, SampleTask


def generation_request(task: SampleTask, uid: int, **changes: object) -> GenerationRequest:
    """The engine request for a task (``changes`` override fields, as an attack may)."""
    request = GenerationRequest(
        uid=str(uid),
        prompt_ids=task.prompt_ids,
        max_tokens=task.sampling.max_tokens,
        temperature=task.sampling.temperature,
        seed=task.seed,
        stream=task.stream,
        eos_token_ids=task.eos_token_ids,
    )
    return replace(request, **changes)  # type: ignore[arg-type]


def _claims(
    tasks: Sequence[SampleTask], results: Sequence[GenerationResult], topk: int, chunk_size: int
) -> list[Claim]:
    proofs = build_proofs([r.hidden_states for r in results], topk, chunk_size)
    return [
        Claim(task, r.completion_ids, r.logprobs, r.finish_reason, proof)
        for task, r, proof in zip(tasks, results, proofs, strict=True)
    ]


def honest_claims(engine: Engine, tasks: Sequence[SampleTask], topk: int = 128, chunk_size: int = 32) -> list[Claim]:
    """What a correct worker submits: generation with the task's sampling, proofs from its own states."""
    results = engine.generate([generation_request(task, i) for i, task in enumerate(tasks)])
    return _claims(tasks, results, topk, chunk_size)


def repaired(engine: HFEngine, claims: Sequence[Claim], topk: int = 128, chunk_size: int = 32) -> list[Claim]:
    """The same tokens with proofs and logprobs rebuilt by a prefill of ``engine`` (the right model)."""
    prefills = engine.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    proofs = build_proofs([p.hidden_states for p in prefills], topk, chunk_size)
    fixed = []
    for claim, prefill, proof in zip(claims, prefills, proofs, strict=True):
        tokens = torch.tensor(claim.completion_ids)
        scaled = torch.log_softmax(prefill.logits / claim.task.sampling.temperature, dim=-1)
        logprobs = scaled.gather(1, tokens.reshape(-1, 1)).reshape(-1).tolist()
        fixed.append(replace(claim, logprobs=logprobs, proof=proof))
    return fixed


def other_model(policy: HFEngine, other: HFEngine, tasks: Sequence[SampleTask]) -> list[Claim]:
    """Everything generated and proven by another model (a random init, or noisy weights, or bf16)."""
    return honest_claims(other, tasks)


def other_model_tokens_proven_by_policy(policy: HFEngine, other: HFEngine, tasks: Sequence[SampleTask]) -> list[Claim]:
    """Tokens from a cheap model; proofs and logprobs from an honest prefill of the policy."""
    return repaired(policy, honest_claims(other, tasks))


def altered_prompt(policy: HFEngine, tasks: Sequence[SampleTask], seed: int = 0) -> list[Claim]:
    """Generate for a prompt with one token changed, claim it answers the issued prompt."""
    rng = random.Random(seed)
    changed = []
    for task in tasks:
        prompt = list(task.prompt_ids)
        position = rng.randrange(len(prompt))
        prompt[position] = (prompt[position] + rng.randrange(1, policy.vocab_size)) % policy.vocab_size
        changed.append(replace(task, prompt_ids=prompt))
    return [replace(claim, task=task) for claim, task in zip(honest_claims(policy, changed), tasks, strict=True)]


def altered_token(policy: HFEngine, tasks: Sequence[SampleTask], seed: int = 0) -> list[Claim]:
    """An honest rollout with one non-EOS completion token swapped for another non-EOS token.

    Completions that are a lone EOS have no such token and are left out of the returned claims.
    """
    rng = random.Random(seed)
    altered = []
    for claim in honest_claims(policy, tasks):
        tokens = list(claim.completion_ids)
        candidates = [i for i, t in enumerate(tokens) if t not in claim.task.eos_token_ids]
        if not candidates:
            continue
        position = rng.choice(candidates)
        replacement = tokens[position]
        while replacement == tokens[position] or replacement in claim.task.eos_token_ids:
            replacement = rng.randrange(policy.vocab_size)
        tokens[position] = replacement
        altered.append(replace(claim, completion_ids=tokens))
    return altered


def flipped_signs(policy: HFEngine, tasks: Sequence[SampleTask]) -> list[Claim]:
    """Honest tokens and logprobs, proof committed to the negated states (passes the reference toploc)."""
    results = policy.generate([generation_request(task, i) for i, task in enumerate(tasks)])
    negated = [replace(r, hidden_states=-r.hidden_states) for r in results]
    return _claims(tasks, negated, 128, 32)


def other_temperature(policy: HFEngine, tasks: Sequence[SampleTask], factor: float) -> list[Claim]:
    """Sample at ``factor`` times the task's temperature (a tiny factor is greedy) and pass it off as the task's."""
    requests = [
        generation_request(task, i, temperature=task.sampling.temperature * factor) for i, task in enumerate(tasks)
    ]
    return repaired(policy, _claims(tasks, policy.generate(requests), 128, 32))


def truncated_claimed_finished(policy: HFEngine, tasks: Sequence[SampleTask], seed: int = 0) -> list[Claim]:
    """Cut an honest completion short and claim it stopped at EOS; proof and logprobs cut to match.

    One-token completions cannot be cut, so they are left out of the returned claims.
    """
    rng = random.Random(seed)
    cut = []
    for claim in honest_claims(policy, tasks):
        if len(claim.completion_ids) < 2:
            continue
        keep = rng.randrange(1, len(claim.completion_ids))
        cut.append(replace(claim, completion_ids=claim.completion_ids[:keep], logprobs=claim.logprobs[:keep]))
    return [replace(c, finish_reason="stop") for c in repaired(policy, cut)]


def padded_after_eos(policy: HFEngine, tasks: Sequence[SampleTask], whole_group: bool = False) -> list[Claim]:
    """Honest completions that drew EOS, continued past it to max_tokens with the policy's own seeded draws.

    Every token is the policy's draw and the proof and logprobs are honest, so only the termination check can
    tell: the filler after the first EOS pads a scored answer to the cap ("length"). Completions that never
    drew an EOS before the cap are left out of the returned claims (``whole_group``: kept, as a worker submits
    them)."""
    results = policy.generate([generation_request(task, i, eos_token_ids=()) for i, task in enumerate(tasks)])
    claims = _claims(tasks, results, 128, 32)
    return [c for c in claims if whole_group or has_early_eos(c)]


def has_early_eos(claim: Claim) -> bool:
    """Whether an EOS id sits before the claim's last token (the sampler would have stopped there)."""
    return any(token in claim.task.eos_token_ids for token in claim.completion_ids[:-1])


class EosSuppressingEngine(HFEngine):
    """The policy with its EOS logits at -inf: it draws as the policy does until the cap, never stopping."""

    def __init__(self, policy: HFEngine, eos_token_ids: Sequence[int]) -> None:
        self.__dict__.update(policy.__dict__)  # the policy's model and settings, shared, not loaded again
        self.suppressed = sorted(set(eos_token_ids))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super()._logits(hidden)
        logits[..., self.suppressed] = float("-inf")
        return logits


def eos_suppressed(policy: HFEngine, tasks: Sequence[SampleTask]) -> list[Claim]:
    """Generate with EOS suppressed to reach the token cap; proofs and logprobs repaired by the policy's prefill.

    Where the seeded draw was never EOS the claim is the honest one; where it was, the claimed token is not
    the draw, which only the sampling replay sees."""
    eos = {token for task in tasks for token in task.eos_token_ids}
    suppressor = EosSuppressingEngine(policy, sorted(eos))
    results = suppressor.generate([generation_request(task, i) for i, task in enumerate(tasks)])
    return repaired(policy, _claims(tasks, results, 128, 32))


Attack = Callable[[Sequence[SampleTask]], list[Claim]]


def attack_suite(
    policy: HFEngine,
    random_init: HFEngine,
    noisy: HFEngine,
    low_precision: HFEngine,
    low_precision_name: str = "lower_precision_bf16",
) -> dict[str, Attack]:
    """Every attack on the proof and sampling checks, by name, as a function of the tasks.

    ``low_precision`` is the policy run cheaper than the run's precision (bf16 for a float32 run,
    int8 weights for a bf16 one); ``low_precision_name`` names that attack."""
    return {
        "other_model_random_init": lambda tasks: other_model(policy, random_init, tasks),
        "other_model_weight_noise_1pct": lambda tasks: other_model(policy, noisy, tasks),
        "altered_prompt_token": lambda tasks: altered_prompt(policy, tasks),
        "altered_completion_token": lambda tasks: altered_token(policy, tasks),
        "flipped_signs": lambda tasks: flipped_signs(policy, tasks),
        low_precision_name: lambda tasks: other_model(policy, low_precision, tasks),
        "greedy_as_sampling": lambda tasks: other_temperature(policy, tasks, 1e-4),
        "other_temperature_half": lambda tasks: other_temperature(policy, tasks, 0.5),
        "cheap_model_tokens_policy_proofs": lambda tasks: other_model_tokens_proven_by_policy(
            policy, random_init, tasks
        ),
        "truncated_claimed_finished": lambda tasks: truncated_claimed_finished(policy, tasks),
    }


def sample_tasks_of(task: Task, eos_token_ids: tuple[int, ...]) -> list[SampleTask]:
    """The samples a ledger task asks for, prompt by prompt, in the order submissions list them."""
    return [
        SampleTask(
            list(prompt.token_ids),
            task.sampling,
            task.sampling_seed,
            sample_stream(prompt.prompt_index, s),
            eos_token_ids,
        )
        for prompt in task.prompts
        for s in range(task.group_size)
    ]


def submission_of(task: Task, claims: Sequence[Claim], engine: Literal["vllm", "hf"] = "hf") -> SubmitRequest:
    """The wire submission of claims made for samples of ``task`` (each placed by its noise stream)."""
    rollouts = [
        Rollout(
            prompt_index=stream_indices(claim.task.stream)[0],
            sample_index=stream_indices(claim.task.stream)[1],
            completion_ids=claim.completion_ids,
            logprobs=claim.logprobs,
            finish_reason=claim.finish_reason,
            proof_b64=base64.b64encode(claim.proof).decode(),
        )
        for claim in claims
    ]
    return SubmitRequest(
        lease_id=task.lease_id,
        task_id=task.task_id,
        policy_version=task.policy_version,
        engine=engine,
        rollouts=rollouts,
    )


def signed_pending(task: Task, submission: SubmitRequest, worker: NodeIdentity | None = None) -> PendingSubmission:
    """``submission`` for ``task``, signed by ``worker`` (a new identity by default), as the ledger hands it to a
    validator."""
    worker = worker or NodeIdentity.generate()
    return PendingSubmission(
        submission_id="s-1",
        worker_id=worker.node_id,
        task=task,
        submission=submission,
        submitted_at=time.time(),
        worker_signature_b64=sign_document(worker, submission.model_dump(mode="json")),
    )
