"""Retention never removes what a restart needs: the trainer service SIGKILLed at every point of a step, resumed.

The trainer service runs as a real process (``python -m trainer.service``); the test plays the
coordinator's part with the same calls the orchestrator makes: it writes step s's batch only
once step s - 1 is published, and after each step is done it "publishes" it and runs
:meth:`TrainDir.prune_published`. For each point of step 2 (after step 1's retention has run)
the service SIGKILLs itself there, is started again, and must finish the run with exactly the
metrics of an uninterrupted run, without exporting a published step again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainer.config import LossConfig, TrainerSection
from trainer.service import FAILPOINT_ENV, FAILPOINTS, ServiceSpec, write_spec
from trainer.transport import StepBatch, TrainDir, TrainSample

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
NUM_STEPS = 3
CRASH_STEP = 2


def batch(step: int) -> StepBatch:
    samples = [
        TrainSample([1, 2, 3], [4 + step, 5, 6 + a], advantage=0.5 - a, inference_logprobs=[-1.0, -2.0, -1.5], reward=r)
        for a, r in ((0, 1.0), (1, 0.0))
    ]
    return StepBatch(step, samples, 1.0, [f"s-{step}"])


def spec(model: Path) -> ServiceSpec:
    return ServiceSpec(trainer=TrainerSection(model=str(model)), loss=LossConfig(), num_steps=NUM_STEPS)


def start_service(train_dir: TrainDir, failpoint: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    log = (train_dir.root / "service.log").open("ab")
    command = [sys.executable, "-m", "trainer.service", "--train-dir", str(train_dir.root)]
    return subprocess.Popen(command, stdout=log, stderr=log, env=env)


def needed_for_restart(train_dir: TrainDir, published: int) -> None:
    """What a restart after ``published`` needs is still there (else the resume below would fail too)."""
    latest = (train_dir.checkpoints / "latest").read_text().strip()
    assert (train_dir.checkpoints / latest / "trainer_state.pt").is_file()
    assert train_dir.read_done(int(latest.removeprefix("step_"))) is not None


def drive(train_dir: TrainDir, failpoint: str | None) -> dict[int, dict[str, Any]]:
    """Run the NUM_STEPS steps as the orchestrator does, restarting the service once if it was killed."""
    proc = start_service(train_dir, failpoint)
    restarts = 0
    metrics: dict[int, dict[str, Any]] = {}
    try:
        for step in range(1, NUM_STEPS + 1):
            if train_dir.read_done(step) is None and not train_dir.has_batch(step):
                train_dir.write_batch(batch(step))
            deadline = time.monotonic() + 300
            while train_dir.read_done(step) is None:
                assert time.monotonic() < deadline, (train_dir.root / "service.log").read_text()[-3000:]
                if proc.poll() is not None:
                    assert proc.returncode == -signal.SIGKILL and restarts == 0, proc.returncode
                    assert step == CRASH_STEP
                    restarts += 1
                    proc = start_service(train_dir, None)
                time.sleep(0.1)
            metrics[step] = train_dir.read_done(step) or {}
            # published: the origin store has it; now the orchestrator's retention runs
            train_dir.prune_published(step)
            needed_for_restart(train_dir, step)
            assert not (train_dir.root / "policies").exists() or not list((train_dir.root / "policies").iterdir())
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert restarts == (1 if failpoint else 0)
    return metrics


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    train_dir = TrainDir(tmp_path_factory.mktemp("reference") / "train")
    train_dir.root.mkdir()
    write_spec(train_dir, spec(tiny_model_dir))
    return drive(train_dir, None)


@pytest.mark.parametrize("point", FAILPOINTS)
def test_a_trainer_killed_at_any_point_after_retention_resumes_exactly(
    point: str, reference: dict[int, dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    train_dir = TrainDir(tmp_path / "train")
    train_dir.root.mkdir()
    write_spec(train_dir, spec(tiny_model_dir))
    crashed = drive(train_dir, f"{point}:{CRASH_STEP}")
    for step in range(1, NUM_STEPS + 1):  # exact resume: the same losses as the run that never crashed
        assert (crashed[step]["step"], crashed[step]["loss"]) == (step, reference[step]["loss"])
    log = (train_dir.root / "service.log").read_text()
    # A published step's policy is never exported again: its done marker survived retention.
    assert f"step {CRASH_STEP - 1} was saved but not marked done" not in log
    if point in ("saved", "pruned"):
        assert f"step {CRASH_STEP} was saved but not marked done" in log
    assert sorted(p.name for p in train_dir.checkpoints.glob("step_*")) == ["step_2", "step_3"]
