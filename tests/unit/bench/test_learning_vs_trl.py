"""The learning bench's pieces: its network config is a valid run of the task, the TRL reward reads the
answer as the environment does, and the summary keys are computed as named."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from bench.learning_vs_trl import network_config, step_phases, summarise
from coordinator.config import CoordinatorConfig
from environments.builtin import builtin_environment

ARGS = argparse.Namespace(
    prompts_per_task=4,
    groups_per_step=8,
    group_size=8,
    max_tokens=16,
    steps=20,
    lr=5e-4,
    warmup_steps=5,
    steps_ahead=1,
    trainer_ranks=2,
    audit_fraction=1.0,
    engines=["vllm", "hf"],
)


def test_the_network_runs_are_runs_of_the_same_task_and_settings(tmp_path: Path) -> None:
    for level in (0, 1):
        config = CoordinatorConfig.model_validate(network_config(tmp_path, tmp_path / "start", 2, ARGS, level))
        assert config.scheduling.async_level == level
        assert config.environment.type == "builtin" and config.environment.name == "sort_digits"
        assert config.orchestrator.groups_per_step * config.scheduling.prompts_per_task == 32
        assert config.orchestrator.trainer.optimizer.lr == 5e-4
        assert config.orchestrator.trainer.optimizer.warmup_steps == 5
        assert config.orchestrator.trainer.seed == 2
        assert config.local_network.engines == ["vllm", "hf"]
        assert config.orchestrator.steps_ahead == 1 and config.orchestrator.trainer_launch.nproc == 2
        assert config.validation.audit_fraction == 1.0


def test_the_trl_reward_reads_the_answer_as_the_environment_does() -> None:
    spec = importlib.util.spec_from_file_location("trl_grpo", Path(__file__).parents[3] / "bench" / "trl_grpo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    environment = builtin_environment("sort_digits")
    example = environment.example(3)
    answer = example.answer or ""
    for text in (answer, f" {answer} \nmore", "0 0 0 0 0", "", f"x\n{answer}"):
        expected = environment.score(example, text).total
        assert (module.first_line(text) == answer) == (expected == 1.0), text


def run(start: float, network: tuple[float, float], sync: float, trl: float, wall: tuple[float, float]) -> Any:
    def side(accuracy: float) -> dict[str, Any]:
        return {"eval": {"accuracy": accuracy, "stop_fraction": 1.0}}

    return {
        "network_level1": {**side(network[0]), "process_to_last_step_s": wall[0], "loop_to_last_step_s": wall[0] / 2},
        "network_level0": side(sync),
        "trl": {**side(trl), "process_to_last_step_s": wall[1], "train_to_last_step_s": wall[1] / 2},
    }


def test_the_summary_keys() -> None:
    runs = [run(0.3, (0.6, 0), 0.5, 0.55, (100.0, 50.0)), run(0.3, (0.5, 0), 0.5, 0.65, (90.0, 60.0))]
    summary = summarise({"accuracy": 0.3, "stop_fraction": 1.0}, runs, 20)
    assert summary["accuracy_start"] == 0.3
    assert summary["accuracy_network"] == pytest.approx(0.55)
    assert summary["accuracy_trl"] == pytest.approx(0.6)
    assert summary["accuracy_gain_min"] == pytest.approx(0.2)  # the smaller seed's gain
    assert summary["gain_over_trl"] == pytest.approx(0.25 / 0.3, abs=1e-4)
    assert summary["wall_over_trl"] == pytest.approx((2.0 + 1.5) / 2)
    assert summary["stop_fraction_end"] == 1.0 and summary["steps"] == 20


def test_step_phases_say_where_a_step_goes() -> None:
    steps = [
        {"step": 1, "recorded_at": 10.0, "trained_at": 12.0, "published_at": 13.0},
        {"step": 2, "recorded_at": 13.0, "trained_at": 16.0, "published_at": 17.0},  # its batch was waiting
        {"step": 3, "recorded_at": 21.0, "trained_at": 23.0, "published_at": 24.0},  # 4 s waiting for its batch
    ]
    assert step_phases(steps) == {"batch_wait": 2.0, "train": round(7 / 3, 3), "publish": 1.0}


def test_step_phases_split_training_by_the_trainers_own_times() -> None:
    steps = [
        {"step": 1, "recorded_at": 0.0, "trained_at": 3.0, "published_at": 3.5, "step_time_s": 1.0, "export_s": 0.5},
        {"step": 2, "recorded_at": 4.0, "trained_at": 7.0, "published_at": 7.5, "step_time_s": 2.0, "export_s": 1.5},
    ]
    phases = step_phases([{**s, "checkpoint_s": None} for s in steps])
    assert phases["train_step_time"] == 1.5 and phases["train_export"] == 1.0
    assert "train_checkpoint" not in phases  # a trainer that did not say is not reported as 0
