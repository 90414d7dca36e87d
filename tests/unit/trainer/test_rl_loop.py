"""The local RL loop with the HF engine: engine and trainer agree on logprobs, weights flow back."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engines.base import GenerationRequest
from engines.hf import HFEngine
from trainer.config import RlConfig
from trainer.rl import run_rl


def test_two_rl_steps_with_the_hf_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = RlConfig(
        trainer={"model": str(tiny_model_dir), "optimizer": {"lr": 1e-3}},
        # the random model never stops within 8 tokens: scored as text, or every reward is 0 and nothing moves
        environment={"type": "builtin", "name": "reverse_text", "truncated": "score"},
        output_dir=tmp_path / "rl",
        num_steps=2,
        prompts_per_step=4,
        group_size=4,
        max_tokens=8,
        eval_examples=4,
        eval_interval_steps=1,
    )
    engine = HFEngine(tiny_model_dir)
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    result = run_rl(config, engine, GenerationRequest)

    assert [step for step, _ in result.evals] == [0, 1, 2]
    assert len(result.steps) == 2
    for record in result.steps:
        # Same weights, same temperature: the trainer recomputes the engine's logprobs.
        assert record["mismatch_kl"] < 1e-6
        assert record["dropped_fraction"] == 0.0
        assert record["num_samples"] == 16
        assert 0.0 <= record["reward_mean"] <= 1.0
    # The engine now holds the exported policy of step 2, which moved away from the start.
    from safetensors.torch import load_file

    exported = load_file(str(tmp_path / "rl" / "policy" / "model.safetensors"))
    now = engine.model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in exported.items())
    assert any(not torch.equal(now[k], start[k]) for k in start)
    lines = (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()
    assert sum("eval_reward_mean" in json.loads(line) for line in lines) == 3


def test_lora_rl_steps_reload_the_adapter_and_agree_with_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The trainer's PEFT model and the engine's base + exported adapter are one policy: at step 2 (generated with
    step 1's adapter) the trainer recomputes the engine's logprobs."""
    from engines.adapted import AdapterView

    config = RlConfig(
        trainer={"model": str(tiny_model_dir), "optimizer": {"lr": 1e-2}, "lora": {"enabled": True, "rank": 4}},
        environment={"type": "builtin", "name": "reverse_text", "truncated": "score"},
        output_dir=tmp_path / "rl",
        num_steps=2,
        prompts_per_step=4,
        group_size=4,
        max_tokens=8,
    )
    engine = AdapterView(HFEngine(tiny_model_dir), "policy")
    result = run_rl(config, engine, GenerationRequest)
    assert engine.serving_adapter
    assert sorted(p.name for p in (tmp_path / "rl" / "policy").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    for record in result.steps:
        assert record["mismatch_kl"] < 1e-6 and record["dropped_fraction"] == 0.0
    assert result.steps[1]["grad_norm"] > 0
