"""The substitution bench's arithmetic, its fake quantisation, and a small run of it end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bench.substitution_bench import (
    detection_curve,
    detection_lower_bound,
    run,
    summarize,
    tokens_to_detect,
)
from tests.support.tiny_model import TinyModelSpec, quantize_linear_layers, save_tiny_qwen2


def test_tokens_to_detect_counts_whole_rollouts_to_the_target() -> None:
    assert tokens_to_detect(1.0, 20.0) == 20.0
    assert tokens_to_detect(0.0, 20.0) is None
    # 1 - 0.5**7 = 0.992 >= 0.99 > 1 - 0.5**6
    assert tokens_to_detect(0.5, 10.0) == 70.0
    curve = detection_curve(0.5, 16.0)
    assert curve["16"] == 0.5 and curve["32"] == 0.75 and curve["8192"] == 1.0


def test_lower_bound_is_clopper_pearson() -> None:
    assert detection_lower_bound(0, 10) == 0.0
    assert math.isclose(detection_lower_bound(10, 10), 0.05 ** (1 / 10), rel_tol=1e-9)
    low = detection_lower_bound(5, 10)
    # P(X >= 5 | p = low) is 5%
    tail = sum(math.comb(10, k) * low**k * (1 - low) ** (10 - k) for k in range(5, 11))
    assert math.isclose(tail, 0.05, rel_tol=1e-6) and 0.18 < low < 0.5


def test_quantized_linear_layers_hold_few_levels_per_group(tmp_path: Path) -> None:
    spec = TinyModelSpec(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1)
    policy = save_tiny_qwen2(tmp_path / "policy", seed=0, spec=spec)
    original = load_file(policy / "model.safetensors")
    for bits, group in ((8, None), (4, 32)):
        weights = load_file(quantize_linear_layers(policy, tmp_path / f"q{bits}", bits, group) / "model.safetensors")
        assert torch.equal(weights["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
        for name in ("model.layers.0.mlp.down_proj.weight", "lm_head.weight"):
            quantized, before = weights[name], original[name]
            assert not torch.equal(quantized, before)
            rows = quantized.reshape(quantized.shape[0], -1, group or quantized.shape[1])
            for values in rows.reshape(-1, rows.shape[-1])[:8]:
                assert len(values.unique()) <= 2**bits - 1
            assert (quantized - before).abs().max() <= before.abs().max() / (2 ** (bits - 1) - 1)


@pytest.mark.slow
def test_a_small_run_catches_both_copies_and_no_honest_rollout() -> None:
    per_engine = run("tiny-heads32", ["hf"], num_prompts=4, group_size=2, max_tokens=24)
    report = summarize(per_engine)
    assert report["summary"]["honest_false_positive_rate"] == 0.0
    for variant in ("int8", "int4"):
        plain = per_engine["hf"][variant]
        assert plain["rejected"] == plain["rollouts"] == 8  # proofs and logprobs of another model
        fixed = per_engine["hf"][f"{variant}_repaired"]
        assert fixed["differing_rejected"] == fixed["differ_from_policy_draws"]  # every changed rollout caught
        caught_some = fixed["differing_rejected"] > 0
        assert (report["summary"][f"tokens_to_detect_{variant}"] is not None) == caught_some
