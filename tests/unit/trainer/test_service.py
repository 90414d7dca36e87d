"""The trainer service in one process: batch files in, policies, checkpoints and done markers out; crash recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import LossConfig, TrainerSection
from trainer.service import ServiceSpec, serve
from trainer.transport import StepBatch, TrainDir, TrainSample


def batch(step: int) -> StepBatch:
    samples = [
        TrainSample([1, 2, 3], [4 + step, 5, 6], advantage=a, inference_logprobs=[-1.0, -2.0, -1.5], reward=r)
        for a, r in ((0.5, 1.0), (-0.5, 0.0))
    ]
    return StepBatch(step, samples, 1.0, [f"s-{step}"])


def test_service_trains_each_batch_once_and_finishes_a_step_saved_without_its_marker(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    train_dir = TrainDir(tmp_path / "train")
    spec = ServiceSpec(trainer=TrainerSection(model=str(tiny_model_dir)), loss=LossConfig(), num_steps=2)
    for step in (1, 2):
        train_dir.write_batch(batch(step))
    serve(train_dir, spec, coordinator_pid=None)
    done = [train_dir.read_done(step) for step in (1, 2)]
    assert [d["step"] if d else None for d in done] == [1, 2]
    assert done[1] is not None and done[1]["reward_mean"] == pytest.approx(0.5)
    assert all(done[1][phase] > 0 for phase in ("step_time_s", "export_s", "checkpoint_s"))  # where a step goes
    for step in (1, 2):
        assert (train_dir.policy_dir(step) / "model.safetensors").is_file()
    assert (train_dir.checkpoints / "latest").read_text().strip() == "step_2"
    exported = (train_dir.policy_dir(2) / "model.safetensors").read_bytes()

    # A crash after saving step 2 but before its done marker: the next start marks it done again.
    train_dir.done_path(2).unlink()
    serve(train_dir, spec, coordinator_pid=None)
    recovered = train_dir.read_done(2)
    assert recovered is not None and recovered["recovered"] and recovered["loss"] == done[1]["loss"]
    assert (train_dir.policy_dir(2) / "model.safetensors").read_bytes() == exported
    assert (read := train_dir.read_batch(1)) is not None and read.submission_ids == ["s-1"]


def test_service_stops_when_the_coordinator_is_gone(tiny_model_dir: Path, tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path / "train")
    spec = ServiceSpec(trainer=TrainerSection(model=str(tiny_model_dir)), loss=LossConfig(), num_steps=1)
    gone_pid = 2**22 + 12345  # above pid_max's default: no such process
    with pytest.raises(SystemExit, match="is gone"):
        serve(train_dir, spec, coordinator_pid=gone_pid)
