"""TensorBoard and W&B copies of the metrics rows: what is sent, under which names, and what a missing package says."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig, TrackingConfig, WandbConfig
from coordinator.loop.run_metrics import RowKind, RunMetricsFile
from coordinator.loop.tracking import TRACKING_EXTRA, Trackers, check_tracking, open_trackers, scalars
from protocol.errors import StartupError


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.rows: list[tuple[RowKind, int, dict[str, Any]]] = []
        self.fail = fail
        self.closed = False

    def log(self, kind: RowKind, step: int, values: Mapping[str, Any]) -> None:
        if self.fail:
            raise OSError("disk full")
        self.rows.append((kind, step, dict(values)))

    def close(self) -> None:
        self.closed = True


def test_a_row_becomes_its_finite_numbers_under_train_or_eval() -> None:
    row = {"loss": 0.5, "batch_num_samples": 8, "grad_norm": float("nan"), "note": "x", "flag": True}
    assert scalars("step", row) == {"train/loss": 0.5, "train/batch_num_samples": 8.0}
    assert scalars("eval", {"eval_accuracy": 0.25, "eval_num_examples": 6}) == {
        "eval/accuracy": 0.25,
        "eval/num_examples": 6.0,
    }


def test_every_row_written_goes_to_the_trackers_once(tmp_path: Path) -> None:
    recorder = Recorder()
    metrics_file = RunMetricsFile(tmp_path / "metrics.jsonl", Trackers([recorder]))
    metrics_file.append("step", 1, 10.0, {"loss": 1.0})
    metrics_file.append("step", 1, 11.0, {"loss": 2.0})  # already in the file: not sent again
    metrics_file.append("eval", 0, 12.0, {"eval_accuracy": 0.5})
    assert recorder.rows == [("step", 1, {"loss": 1.0}), ("eval", 0, {"eval_accuracy": 0.5})]


def test_a_tracker_that_fails_is_dropped_and_the_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    broken, working = Recorder(fail=True), Recorder()
    trackers = Trackers([broken, working])
    trackers.log("step", 1, {"loss": 1.0})
    trackers.log("step", 2, {"loss": 0.5})
    assert [step for _kind, step, _values in working.rows] == [1, 2]
    assert trackers.trackers == [working] and "Recorder stopped logging metrics: disk full" in caplog.text
    trackers.close()
    assert working.closed


@pytest.mark.parametrize(
    ("config", "package"),
    [(TrackingConfig(tensorboard=True), "tensorboard"), (TrackingConfig(wandb=WandbConfig(mode="offline")), "wandb")],
)
def test_a_missing_package_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, config: TrackingConfig, package: str
) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else found(name, *a))
    with pytest.raises(StartupError) as refused:
        check_tracking(config)
    message = str(refused.value)
    assert package in message and TRACKING_EXTRA in message and "\n" not in message
    check_tracking(TrackingConfig())  # nothing switched on: nothing needed


def test_the_tracking_section_is_off_by_default_and_strict() -> None:
    tracking = CoordinatorConfig().orchestrator.tracking
    assert not tracking.tensorboard and tracking.wandb.mode == "disabled"
    assert open_trackers(tracking, "run", Path("unused")).trackers == []
    with pytest.raises(ValueError, match="mode"):
        WandbConfig.model_validate({"mode": "cloud"})


def test_tensorboard_holds_each_step_at_its_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = open_trackers(TrackingConfig(tensorboard=True), "run", tmp_path)
    for step in (1, 2, 3):
        trackers.log("step", step, {"loss": 1.0 / step})
    trackers.log("eval", 0, {"eval_accuracy": 0.125})
    trackers.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert [(e.step, e.value) for e in events.Scalars("eval/accuracy")] == [(0, 0.125)]
