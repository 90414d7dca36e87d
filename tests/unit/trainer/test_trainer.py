"""The trainer in one process: exact resume, split-invariant updates, HF export, LR schedule."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from environments.builtin import builtin_environment
from tests.integration.trainer.fsdp_probe import probe_batch
from trainer.config import LossConfig, OptimizerConfig, TrainerSection
from trainer.optim import Schedule, build_scheduler, lr_factor
from trainer.sft import sft_batch
from trainer.train import Trainer


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _section(model: Path, **packing: Any) -> TrainerSection:
    optimizer = OptimizerConfig(lr=1e-3, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    return TrainerSection(model=str(model), optimizer=optimizer, packing=dict(packing) or {})


def test_resume_reproduces_the_next_step_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    loss = LossConfig(correction="mask", mask_low=0.99, mask_high=100.0)
    first = Trainer(_section(tiny_model_dir), num_steps=10)
    first.sft_step(sft_batch(builtin_environment("reverse_text"), first.tokenizer, 0, 16))
    first.rl_step(probe_batch(first, 1), loss)
    first.save(tmp_path / "ckpt")
    expected = first.rl_step(probe_batch(first, 2), loss)
    expected_params = _params(first)

    second = Trainer(_section(tiny_model_dir), num_steps=10)
    assert second.resume(tmp_path / "ckpt")
    assert second.step == 2
    got = second.rl_step(probe_batch(second, 2), loss)
    assert got["loss"] == expected["loss"]
    assert got["lr"] == expected["lr"]
    assert got["grad_norm"] == expected["grad_norm"]
    for name, value in _params(second).items():
        assert torch.equal(value, expected_params[name]), name


def test_resume_without_checkpoint_is_false(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert not Trainer(_section(tiny_model_dir), num_steps=1).resume(tmp_path / "none")


def test_update_does_not_depend_on_micro_batching(tiny_model_dir: Path) -> None:
    results = []
    for packing in ({"micro_batch_tokens": 4096}, {"micro_batch_tokens": 96, "row_tokens": 48}, {"enabled": False}):
        trainer = Trainer(_section(tiny_model_dir, **packing), num_steps=10)
        metrics = trainer.rl_step(probe_batch(trainer, 5), LossConfig())
        results.append((metrics, _params(trainer)))
    (base, base_params), others = results[0], results[1:]
    assert others[0][0]["num_micro_batches"] > base["num_micro_batches"]
    for metrics, params in others:
        assert metrics["loss"] == pytest.approx(base["loss"], abs=1e-6)
        assert metrics["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
        for name, value in params.items():
            torch.testing.assert_close(value, base_params[name], atol=1e-6, rtol=1e-5)


def test_sft_steps_lower_the_completion_loss(tiny_model_dir: Path) -> None:
    trainer = Trainer(_section(tiny_model_dir), num_steps=20)
    held_out = sft_batch(builtin_environment("reverse_text"), trainer.tokenizer, 1000, 32)
    before = trainer.completion_loss(held_out)
    for step in range(8):
        trainer.sft_step(sft_batch(builtin_environment("reverse_text"), trainer.tokenizer, step, 32))
    assert trainer.completion_loss(held_out) < before - 0.3


def test_exported_policy_loads_in_hf_with_the_same_greedy_output(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = Trainer(_section(tiny_model_dir), num_steps=10)
    for step in range(3):
        trainer.sft_step(sft_batch(builtin_environment("reverse_text"), trainer.tokenizer, step, 32))
    exported = trainer.export(tmp_path / "policy")
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in exported.iterdir()
    }
    loaded: Any = AutoModelForCausalLM.from_pretrained(str(exported))
    loaded.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(exported))
    assert loaded.config.tie_word_embeddings is False
    trainer.model.eval()
    prompt = torch.tensor([tokenizer.encode("reverse: abc de\n", add_special_tokens=False)])
    kwargs = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tokenizer.eos_token_id}
    with torch.no_grad():
        ours = trainer.model.generate(prompt, **kwargs)  # type: ignore[operator]
        theirs = loaded.generate(prompt, **kwargs)
    assert torch.equal(ours, theirs)
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_lr_schedule() -> None:
    config = OptimizerConfig(lr=1.0, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(s, 12, config) for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, 12, config) == pytest.approx(1.0)
    assert lr_factor(11, 12, config) == pytest.approx(0.1)
    linear = OptimizerConfig(schedule="linear")
    assert lr_factor(5, 11, linear) == pytest.approx(0.5)
    assert lr_factor(7, 11, OptimizerConfig()) == 1.0


def test_a_resumed_schedule_keeps_its_restore_and_takes_the_run_its_config_gives() -> None:
    """The scheduler's state carries where a restore warmed up again, and nothing of the schedule itself: a run
    resumed with more steps (or another warm-up) follows its new config."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first = build_scheduler(optimizer, 10, OptimizerConfig(lr=1.0, schedule="linear"))
    (schedule,) = first.lr_lambdas
    assert isinstance(schedule, Schedule)
    schedule.rewarm(3)
    state = first.state_dict()
    assert state["lr_lambdas"] == [{"rewarm_from": 3}]
    longer = build_scheduler(optimizer, 100, OptimizerConfig(lr=1.0, schedule="linear", warmup_steps=4))
    longer.load_state_dict(state)
    (resumed,) = longer.lr_lambdas
    assert isinstance(resumed, Schedule)
    assert (resumed.rewarm_from, resumed.num_steps, resumed.rewarm_steps) == (3, 100, 4)


def test_the_loss_is_a_mean_over_the_trained_tokens_only(tiny_model_dir: Path) -> None:
    """A multi-turn sample's completion holds the environment's replies, which carry no loss: the step's loss,
    its figures and its gradient scale are over the sampled tokens alone."""
    trainer = Trainer(_section(tiny_model_dir), num_steps=10)
    samples = [
        dataclasses.replace(
            sample, sampled=[i < len(sample.completion_ids) // 2 for i in range(len(sample.completion_ids))]
        )
        for sample in sft_batch(builtin_environment("reverse_text"), trainer.tokenizer, 0, 8)
    ]
    num_trained = sum(sample.num_trained for sample in samples)
    assert 0 < num_trained < sum(len(sample.completion_ids) for sample in samples)
    expected = trainer.completion_loss(samples)  # before the step: the step reports the loss it took the gradient of
    metrics = trainer.sft_step(samples)
    assert metrics["num_loss_tokens"] == num_trained
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
