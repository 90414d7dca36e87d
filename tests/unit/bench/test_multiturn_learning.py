"""The multi-turn learning bench's pieces: its network config is a valid calculator run, and the summary keys
are computed as named."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.multiturn_learning import ENVIRONMENT, summarise
from bench.runs import network_run_config
from coordinator.config import CoordinatorConfig

ARGS = argparse.Namespace(
    prompts_per_task=4,
    groups_per_step=8,
    group_size=8,
    max_tokens=24,
    steps=30,
    lr=5e-4,
    warmup_steps=5,
    trainer_ranks=1,
    engines=["vllm", "hf"],
)


def test_the_network_run_is_a_calculator_run(tmp_path: Path) -> None:
    config = CoordinatorConfig.model_validate(network_run_config("m", tmp_path, tmp_path / "s", ENVIRONMENT, 1, ARGS))
    assert config.environment.type == "builtin" and config.environment.name == "calculator"
    assert config.orchestrator.trainer.seed == 1 and config.orchestrator.num_steps == 30
    assert config.scheduling.max_tokens == 24 and config.local_network.engines == ["vllm", "hf"]


def test_the_summary_is_computed_as_named() -> None:
    def steps(share: float, turns: float) -> list[dict[str, float]]:
        return [{"batch_sampled_fraction": share, "batch_turns_mean": turns}] * 2

    runs = [
        {"eval": {"accuracy": 0.5, "turns_mean": 2.0}, "steps": steps(0.5, 2.0)},
        {"eval": {"accuracy": 0.4, "turns_mean": 1.8}, "steps": steps(0.6, 1.6)},
    ]
    summary = summarise({"accuracy": 0.25, "turns_mean": 1.9}, runs, {"verify_over_generate": 0.6}, 30)
    assert summary["accuracy_start"] == 0.25 and summary["accuracy_end"] == pytest.approx(0.45)
    assert summary["accuracy_gain_min"] == pytest.approx(0.15)
    assert summary["sampled_token_share"] == pytest.approx(0.55) and summary["turns_mean"] == pytest.approx(1.8)
    assert summary["verify_over_generate"] == 0.6 and summary["eval_turns_mean_end"] == pytest.approx(1.9)
