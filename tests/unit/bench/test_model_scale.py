"""The model-scale bench: its summary from the figures, its task, and its HF and validator path on a small shape."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.model_scale import (
    audit,
    bench_task,
    checkpoints,
    hf_generation,
    parse_args,
    qwen3_config,
    sampler_micro,
    signed,
    summarize,
)
from protocol.identity import NodeIdentity
from toploc.config import ToplocConfig


def _figures(attacks_accepted: tuple[bool, ...] = (False, False)) -> dict[str, Any]:
    return {
        "params": 596_049_920,
        "policy_bytes": 2_384_199_680,
        "vllm": {
            "tokens": 2048,
            "generate_s": 100.0,
            "plain_generate_s": 98.0,
            "sampler_s": 3.0,
            "plain_sampler_s": 1.04,
            "proof_build_s": 0.5,
        },
        "hf": {"tokens": 2048, "generate_s": 250.0},
        "audits": {
            "honest": {
                "vllm": {"audit_s": 80.0, "rollouts_rejected": 0, "accepted": True},
                "hf": {"audit_s": 81.0, "rollouts_rejected": 2, "accepted": False},
            },
            "attacks": {f"a{i}": {"accepted": accepted} for i, accepted in enumerate(attacks_accepted)},
        },
    }


def test_summary_keys_follow_their_definitions() -> None:
    summary = summarize(_figures())
    assert summary == {
        "params": 596_049_920,
        "proof_overhead_fraction": 0.005,  # 0.5 s of proofs / 100 s of vLLM generation
        "sampler_overhead_fraction": 0.02,  # (3.0 - 1.04) s more in vLLM's sampler / 98 s of plain generation
        "vllm_over_hf": 2.5,  # the same tokens in 100 s vs 250 s
        "verify_over_generate": 0.8,  # auditing the vLLM submission / generating it
        "policy_bytes": 2_384_199_680,
        "honest_rejections": 2,  # rollouts, over both honest submissions
        "attacks_detected": 1.0,
    }


def test_attacks_detected_is_the_fraction_of_attack_submissions_rejected() -> None:
    assert summarize(_figures((True, False)))["attacks_detected"] == 0.5
    assert summarize(_figures((True, True)))["attacks_detected"] == 0.0
    assert math.isnan(summarize(_figures(()))["attacks_detected"])


def test_the_task_has_groups_of_eight_and_prompts_inside_the_vocabulary() -> None:
    task = bench_task(0, 16, prompt_tokens=32, new_tokens=128, vocab_size=151_936)
    assert task.group_size == 8 and len(task.prompts) == 2
    assert all(len(p.token_ids) == 32 and max(p.token_ids) < 151_936 for p in task.prompts)
    assert task.sampling.max_tokens == 128
    assert bench_task(0, 4, 8, 8, 100).group_size == 4
    assert bench_task(0, 16, 32, 128, 151_936).prompts == task.prompts  # the same prompts in every run
    assert bench_task(1, 16, 32, 128, 151_936).prompts != task.prompts
    with pytest.raises(SystemExit, match="multiple of 8"):
        bench_task(0, 12, 8, 8, 100)


def test_the_default_shape_is_qwen3_0_6b() -> None:
    config = qwen3_config(28, 151_936)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (1024, 28, 16)
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (8, 128, 3072)
    assert config.vocab_size == 151_936 and config.tie_word_embeddings
    args = parse_args([])
    assert (args.layers, args.sequences, args.new_tokens, args.dtype, args.device) == (28, 16, 128, "float32", "cpu")
    quick = parse_args(["--quick", "--dtype", "bfloat16"])
    assert (quick.layers, quick.sequences, quick.dtype) == (2, 4, "bfloat16")


@pytest.mark.slow
def test_honest_work_passes_and_attacks_fail_on_a_one_layer_model(tmp_path: Path) -> None:
    """The HF engine, the worker's proofs and the validator's audit through the bench's own functions."""
    paths = checkpoints(1, 4096, torch.float32, cache_dir=tmp_path)
    assert checkpoints(1, 4096, torch.float32, cache_dir=tmp_path) == paths  # built once, then reused
    task = bench_task(0, 2, prompt_tokens=8, new_tokens=24, vocab_size=4096)
    engine, honest = hf_generation(paths["policy"], task, "float32", "cpu", threads=None)
    assert honest["tokens"] == 48 and honest["sampler_s"] > 0
    worker = NodeIdentity.generate()
    config = ToplocConfig()
    verdict, reasons = audit(engine, signed(worker, task, honest["submission"], "honest"), config, repeats=1)
    assert verdict["accepted"] and verdict["rollouts_rejected"] == 0, reasons
    for name in ("other", "noisy"):
        attacker, attack = hf_generation(paths[name], task, "float32", "cpu", threads=None)
        attacker.close()
        verdict, reasons = audit(engine, signed(worker, task, attack["submission"], name), config, repeats=1)
        assert not verdict["accepted"] and reasons, name
    micro = sampler_micro(engine, task, honest["submission"], repeats=1)
    assert micro["same_tokens_as_definition"] and micro["rows"] == 16
