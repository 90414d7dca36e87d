"""Evals during training: the schedule, the reading of a report, the copy of a policy the loop will prune."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.loop.evals import PolicyEvals, eval_due, eval_figures, link_tree
from runtime.config import load_config
from trainer.config import EvalConfig


def test_the_start_policy_every_nth_and_the_last_are_evaluated() -> None:
    assert [s for s in range(0, 11) if eval_due(s, 4, 10)] == [0, 4, 8, 10]
    assert [s for s in range(0, 7) if eval_due(s, 3, 6)] == [0, 3, 6]
    assert [s for s in range(0, 4) if eval_due(s, 1, 3)] == [0, 1, 2, 3]
    assert not any(eval_due(s, 0, 10) for s in range(0, 11))  # 0: off
    assert not eval_due(12, 4, 10) and not eval_due(-4, 4, 10)


def test_an_eval_report_becomes_eval_figures_or_nothing() -> None:
    report = {
        "model": "/x",
        "task": "reverse_text",
        "num_examples": 8,
        "num_samples": 1,
        "reward_mean": 0.5,
        "accuracy": 0.125,
        "stop_fraction": 0.0,
        "mean_completion_tokens": 16.0,
    }
    assert eval_figures(report) == {
        "eval_accuracy": 0.125,
        "eval_reward_mean": 0.5,
        "eval_stop_fraction": 0.0,
        "eval_completion_tokens_mean": 16.0,
        "eval_num_examples": 8.0,
        "eval_num_samples": 1.0,
    }
    assert eval_figures({**report, "accuracy": float("nan")}) is None
    assert eval_figures({**report, "accuracy": True}) is None
    assert eval_figures({k: v for k, v in report.items() if k != "stop_fraction"}) is None
    assert eval_figures([report]) is None


def test_a_policy_is_linked_so_pruning_the_original_leaves_the_copy(tmp_path: Path) -> None:
    source = tmp_path / "policies" / "step_3"
    (source / "sub").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"weights")
    (source / "sub" / "config.json").write_text("{}")
    target = tmp_path / "evals" / "step_3" / "policy"
    link_tree(source, target)
    assert os.path.samefile(source / "model.safetensors", target / "model.safetensors")
    for path in sorted(source.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert (target / "sub" / "config.json").read_text() == "{}"


def test_the_eval_runs_the_runs_environment_sampling_and_budget(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        data_dir=tmp_path,
        environment={"type": "builtin", "name": "arithmetic"},
        scheduling={"temperature": 0.7, "max_tokens": 24},
        orchestrator={"eval_every_steps": 2, "eval_num_examples": 5},
    )
    evals = PolicyEvals(config, record=lambda step, figures, model_dir: None)
    eval_config = evals.eval_config(tmp_path / "policy")
    assert (eval_config.num_examples, eval_config.temperature, eval_config.max_tokens) == (5, 0.7, 24)
    assert eval_config.environment == config.environment and eval_config.model == str(tmp_path / "policy")
    # the child reads back the config it is given as TOML
    from runtime.config import config_to_toml

    written = tmp_path / "eval.toml"
    written.write_text(config_to_toml(eval_config))
    assert load_config(EvalConfig, written) == eval_config


def test_eval_settings_are_checked_at_start_up() -> None:
    with pytest.raises(ValueError, match="eval_every_steps"):
        CoordinatorConfig(orchestrator={"eval_every_steps": -1})
    with pytest.raises(ValueError, match="eval_num_examples"):
        CoordinatorConfig(orchestrator={"eval_num_examples": 0})
