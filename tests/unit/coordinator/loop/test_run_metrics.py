"""The run-long metrics file: a row per trained step and per eval, each once, across restarts and torn lines."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator.ledger.train_steps import StepRecord
from coordinator.loop.run_metrics import RunMetricsFile, eval_values, step_values


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def record(step: int, state: str, metrics: dict[str, float]) -> StepRecord:
    return StepRecord(step=step, state=state, min_policy_version=0, submission_ids=[], metrics=metrics)


def test_every_step_is_kept_once_with_its_kind_and_step(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    metrics_file = RunMetricsFile(path)
    for step in range(1, 6):
        assert metrics_file.append("step", step, 100.0 + step, {"loss": 0.1 * step, "batch_stop_fraction": 1.0})
    assert metrics_file.append("eval", 5, 106.0, {"eval_accuracy": 0.25})
    assert not metrics_file.append("step", 3, 200.0, {"loss": 9.0})  # once per step, whatever comes again
    found = rows(path)
    assert [(r["kind"], r["step"]) for r in found] == [("step", s) for s in range(1, 6)] + [("eval", 5)]
    assert found[2] == {"kind": "step", "step": 3, "at": 103.0, "loss": 0.30000000000000004, "batch_stop_fraction": 1.0}
    # a restarted coordinator knows what the file holds
    again = RunMetricsFile(path)
    assert again.has("step", 5) and again.has("eval", 5) and not again.has("eval", 4)
    assert not again.append("eval", 5, 300.0, {"eval_accuracy": 0.5})


def test_a_row_torn_by_a_crash_is_dropped_and_written_again(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    RunMetricsFile(path).append("step", 1, 1.0, {"loss": 1.0})
    with path.open("a") as f:
        f.write('{"kind": "step", "step": 2, "lo')  # the process died mid-row
    metrics_file = RunMetricsFile(path)
    assert not metrics_file.has("step", 2)
    assert metrics_file.append("step", 2, 2.0, {"loss": 2.0})
    assert [r["step"] for r in rows(path)] == [1, 2]


def test_sync_writes_the_ledgers_trained_steps_and_evals_the_file_lacks(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    metrics_file = RunMetricsFile(path)
    metrics_file.append("step", 1, 1.0, {"loss": 1.0})
    records = [
        record(1, "published", {"loss": 1.0}),
        record(2, "published", {"loss": 2.0, "eval_accuracy": 0.5, "eval_reward_mean": 0.75}),
        record(3, "trained", {"loss": 3.0}),
        record(4, "recorded", {}),  # not trained yet: no row
    ]
    assert metrics_file.sync(records, at=9.0) == 3
    assert metrics_file.sync(records, at=10.0) == 0
    found = rows(path)
    assert [(r["kind"], r["step"]) for r in found] == [("step", 1), ("step", 2), ("eval", 2), ("step", 3)]
    assert found[1] == {"kind": "step", "step": 2, "at": 9.0, "loss": 2.0}
    assert found[2] == {"kind": "eval", "step": 2, "at": 9.0, "eval_accuracy": 0.5, "eval_reward_mean": 0.75}


def test_step_and_eval_values_split_a_steps_metrics() -> None:
    metrics = {"loss": 1.0, "batch_reward_mean": 0.5, "eval_accuracy": 0.25}
    assert step_values(metrics) == {"loss": 1.0, "batch_reward_mean": 0.5}
    assert eval_values(metrics) == {"eval_accuracy": 0.25}
