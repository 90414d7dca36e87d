"""bf16 end to end on a tiny model: honest bf16 rollouts pass the bf16 calibration, cheats still fail it.

Generation and the validator's prefill both run the HF engine in bfloat16 (generation batched 8 at a
time, prefill one at a time and all together, so rows round differently) and are judged with the
shipped bfloat16 HF calibration (toploc/calibration/bfloat16_hf_hf.json); the float32 thresholds
reject the same honest rollouts, which is why a bf16 run needs its own. The full-size figures
(a ~56M-parameter model, 1,000 rollouts per engine, the whole attack suite) are the calibration
bench's: thresholds made for that model are loose for this 64-wide one, where one changed prompt
token moves the states less than bf16 rounding does on the larger model, so only cheats far
outside them are tried here.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engines.hf import HFEngine
from protocol.schemas import SamplingParams
from tests.support.adversary import flipped_signs, honest_claims, other_model, other_temperature
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, save_tiny_qwen2
from toploc.calibrations import toploc_config
from toploc.config import ToplocConfig
from toploc.sampling import sample_stream
from toploc.verify import Claim, RolloutVerdict, SampleTask, verify_claims


def make_tasks(num_prompts: int, seed: int) -> list[SampleTask]:
    rng = random.Random(seed)
    return [
        SampleTask(
            [rng.randrange(2, 1024) for _ in range(rng.randint(1, 40))],
            SamplingParams(temperature=(0.7, 1.0, 1.3)[i % 3], max_tokens=40),
            seed * 7919 + i,
            sample_stream(i, 0),
            (TINY_EOS_TOKEN_ID,),
        )
        for i in range(num_prompts)
    ]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen2(tmp_path_factory.mktemp("policy"), seed=0)


@pytest.fixture(scope="module")
def validator(policy_dir: Path) -> HFEngine:
    return HFEngine(policy_dir, dtype="bfloat16")


def verify(engine: HFEngine, claims: list[Claim], config: ToplocConfig, batch_size: int = 64) -> list[RolloutVerdict]:
    engine.max_batch_size = batch_size
    prefills = engine.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    return verify_claims(claims, prefills, config)


def test_honest_bf16_rollouts_pass_the_bf16_calibration(policy_dir: Path, validator: HFEngine) -> None:
    worker = HFEngine(policy_dir, dtype="bfloat16", max_batch_size=8)
    claims = honest_claims(worker, make_tasks(24, seed=1))
    bf16 = toploc_config("bfloat16", "hf")
    for batch_size in (1, 64):
        for verdict in verify(validator, claims, bf16, batch_size):
            assert verdict.accepted, verdict.reasons
    float32_rejections = sum(not v.accepted for v in verify(validator, claims, toploc_config("float32", "hf")))
    assert float32_rejections > 0, "bf16 noise is over the float32 thresholds"


def test_cheats_fail_the_bf16_calibration(policy_dir: Path, validator: HFEngine, tmp_path: Path) -> None:
    bf16 = toploc_config("bfloat16", "hf")
    tasks = make_tasks(12, seed=2)
    honest_tokens = [c.completion_ids for c in honest_claims(validator, tasks)]
    random_init = HFEngine(save_tiny_qwen2(tmp_path / "other", seed=1), dtype="bfloat16")
    cheats = {
        "other_model_random_init": (other_model(validator, random_init, tasks), "toploc"),
        "flipped_signs": (flipped_signs(validator, tasks), "toploc"),
        "greedy_as_sampling": (other_temperature(validator, tasks, 1e-4), "sampling"),
    }
    for name, (claims, check) in cheats.items():
        trials = 0
        for claim, honest, verdict in zip(claims, honest_tokens, verify(validator, claims, bf16), strict=True):
            if name == "greedy_as_sampling" and claim.completion_ids == honest:
                assert verdict.accepted, "greedy drew the sampler's own tokens: an honest rollout"
                continue
            trials += 1
            assert not verdict.accepted, name
            assert any(reason.startswith(check) for reason in verdict.reasons), (name, verdict.reasons)
        assert trials >= 8, (name, trials)
