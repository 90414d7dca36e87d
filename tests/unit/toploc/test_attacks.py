"""The TOPLOC issue's attack suite: every attack rejected on every trial; honest work never rejected.

Runs on the tiny random Qwen2 with the calibrated default thresholds (toploc.config). The
attacks (tests.support.adversary) repair whatever they do not need wrong with a prefill of the right
model, so each trial is caught by the check aimed at that cheat, not by a side effect.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest
import torch

from engines.hf import HFEngine
from protocol.schemas import SamplingParams
from tests.support.adversary import (
    Attack,
    attack_suite,
    eos_suppressed,
    honest_claims,
    other_model_tokens_proven_by_policy,
    padded_after_eos,
)
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, perturb_checkpoint, save_tiny_qwen2
from toploc.config import ToplocConfig
from toploc.sampling import sample_stream
from toploc.verify import Claim, RolloutVerdict, SampleTask, verify_claims

# Which check must catch each attack (others may fire too).
EXPECTED_CHECK = {
    "other_model_random_init": "toploc",
    "other_model_weight_noise_1pct": "toploc",
    "altered_prompt_token": "toploc",
    "altered_completion_token": "sampling",
    "flipped_signs": "toploc",
    "lower_precision_bf16": "toploc",
    "greedy_as_sampling": "sampling",
    "other_temperature_half": "sampling",
    "cheap_model_tokens_policy_proofs": "sampling",
    "truncated_claimed_finished": "termination",
}


def make_tasks(num_prompts: int, group_size: int, max_tokens: int, seed: int) -> list[SampleTask]:
    rng = random.Random(seed)
    tasks = []
    for prompt_index in range(num_prompts):
        prompt = [rng.randrange(2, 1024) for _ in range(rng.randint(1, 40))]
        sampling = SamplingParams(temperature=(0.7, 1.0, 1.3)[prompt_index % 3], max_tokens=max_tokens)
        for sample_index in range(group_size):
            stream = sample_stream(prompt_index, sample_index)
            tasks.append(SampleTask(prompt, sampling, seed * 7919 + prompt_index, stream, (TINY_EOS_TOKEN_ID,)))
    return tasks


def verify_all(engine: HFEngine, claims: list[Claim]) -> list[RolloutVerdict]:
    prefills = engine.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    return verify_claims(claims, prefills, ToplocConfig())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    policy = save_tiny_qwen2(root / "policy", seed=0)
    return {
        "policy": policy,
        "random_init": save_tiny_qwen2(root / "random_init", seed=1),
        "noisy": perturb_checkpoint(policy, root / "noisy", relative_noise=0.01, seed=2),
    }


@pytest.fixture(scope="module")
def policy(models: dict[str, Path]) -> HFEngine:
    return HFEngine(models["policy"])


@pytest.fixture(scope="module")
def noisy(models: dict[str, Path]) -> HFEngine:
    return HFEngine(models["noisy"])


@pytest.fixture(scope="module")
def attacks(models: dict[str, Path], policy: HFEngine, noisy: HFEngine) -> dict[str, Attack]:
    random_init = HFEngine(models["random_init"])
    low_precision = HFEngine(models["policy"], dtype="bfloat16")
    return attack_suite(policy, random_init, noisy, low_precision)


def test_suite_covers_every_attack_of_the_issue(attacks: dict[str, Attack]) -> None:
    assert set(attacks) == set(EXPECTED_CHECK)


# Attacks that replace tokens: a trial whose tokens happen to be exactly the policy's own draws
# (e.g. a lone EOS both models drew) is an honest rollout, not a cheat, and must be accepted.
TOKEN_SUBSTITUTIONS = {"cheap_model_tokens_policy_proofs", "greedy_as_sampling", "other_temperature_half"}


@pytest.mark.parametrize("name", sorted(EXPECTED_CHECK))
def test_attack_is_rejected_on_every_trial(name: str, attacks: dict[str, Attack], policy: HFEngine) -> None:
    tasks = make_tasks(num_prompts=12, group_size=1, max_tokens=40, seed=zlib.crc32(name.encode()) % 1000)
    claims = attacks[name](tasks)
    honest_tokens = {(id(c.task), tuple(c.completion_ids)) for c in honest_claims(policy, tasks)}
    num_trials = 0
    for claim, verdict in zip(claims, verify_all(policy, claims), strict=True):
        if name in TOKEN_SUBSTITUTIONS and (id(claim.task), tuple(claim.completion_ids)) in honest_tokens:
            assert verdict.accepted, verdict.reasons
            continue
        num_trials += 1
        assert not verdict.accepted, f"{name}: accepted {claim.completion_ids}"
        assert any(r.startswith(EXPECTED_CHECK[name]) for r in verdict.reasons), (name, verdict.reasons)
    assert num_trials >= 10, "too few trials"


def test_honest_claims_in_the_same_setting_pass(policy: HFEngine) -> None:
    tasks = make_tasks(num_prompts=12, group_size=1, max_tokens=40, seed=5)
    for verdict in verify_all(policy, honest_claims(policy, tasks)):
        assert verdict.accepted, verdict.reasons


def test_any_token_off_the_policys_draw_is_caught(policy: HFEngine, noisy: HFEngine) -> None:
    """Tokens of a model 1% away, proven by the policy: rejected exactly when some token differs."""
    tasks = make_tasks(num_prompts=24, group_size=1, max_tokens=96, seed=9)
    honest_tokens = [c.completion_ids for c in honest_claims(policy, tasks)]
    claims = other_model_tokens_proven_by_policy(policy, noisy, tasks)
    verdicts = verify_all(policy, claims)
    differing = 0
    for claim, honest, verdict in zip(claims, honest_tokens, verdicts, strict=True):
        if claim.completion_ids == honest:
            assert verdict.accepted, "the policy's own draws are an honest rollout"
        else:
            differing += 1
            assert not verdict.accepted and any(r.startswith("sampling") for r in verdict.reasons)
    assert differing >= 3


@pytest.mark.slow
def test_no_false_rejections_over_many_honest_rollouts(models: dict[str, Path]) -> None:
    """>= 500 honest rollouts: batch sizes 1-64, left padding, 1 or 2 threads, gen vs prefill states."""
    tasks = make_tasks(num_prompts=32, group_size=2, max_tokens=48, seed=3)
    generator = HFEngine(models["policy"])
    validator = HFEngine(models["policy"])
    threads_before = torch.get_num_threads()
    num_rollouts = 0
    try:
        for variation, (batch_size, threads) in enumerate([(b, t) for t in (1, 2) for b in (1, 4, 16, 64)]):
            torch.set_num_threads(threads)
            generator.max_batch_size = batch_size
            claims = honest_claims(generator, tasks)
            torch.set_num_threads(1 + variation % 2)
            validator.max_batch_size = (64, 1, 7)[variation % 3]
            for verdict in verify_all(validator, claims):
                assert verdict.accepted, (batch_size, threads, verdict.reasons)
            num_rollouts += len(claims)
    finally:
        torch.set_num_threads(threads_before)
    assert num_rollouts >= 500


def test_tokens_after_the_first_eos_are_rejected(policy: HFEngine) -> None:
    """The policy's own draws continued past EOS to the cap: every token seeded, every proof honest, rejected."""
    tasks = make_tasks(num_prompts=24, group_size=1, max_tokens=40, seed=11)
    claims = padded_after_eos(policy, tasks)
    assert len(claims) >= 5, "too few completions drew an EOS before the cap"
    for verdict in verify_all(policy, claims):
        assert not verdict.accepted
        assert any(r.startswith("termination: EOS at position") for r in verdict.reasons), verdict.reasons
        assert not any(r.startswith(("toploc", "sampling", "logprobs")) for r in verdict.reasons), verdict.reasons


def test_eos_suppressed_to_the_cap_is_caught_by_the_sampling_replay(policy: HFEngine) -> None:
    """Rejected exactly where the seeded draw was EOS (the honest rollout stops early); otherwise honest."""
    tasks = make_tasks(num_prompts=24, group_size=1, max_tokens=40, seed=13)
    honest = honest_claims(policy, tasks)
    claims = eos_suppressed(policy, tasks)
    stopped_early = 0
    for claim, honest_claim, verdict in zip(claims, honest, verify_all(policy, claims), strict=True):
        assert claim.finish_reason == "length" and len(claim.completion_ids) == 40
        if honest_claim.finish_reason == "length":
            assert claim.completion_ids == honest_claim.completion_ids and verdict.accepted, verdict.reasons
            continue
        stopped_early += 1
        assert not verdict.accepted
        assert any(r.startswith("sampling") for r in verdict.reasons), verdict.reasons
        assert not any(r.startswith(("toploc", "termination", "logprobs")) for r in verdict.reasons), verdict.reasons
    assert stopped_early >= 5
