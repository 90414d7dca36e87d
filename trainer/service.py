"""The trainer service: one torchrun job that trains every step the orchestrator hands it.

``torchrun --nproc-per-node N -m trainer.service --train-dir DIR`` (the coordinator launches it
once per run and keeps it up across steps). Each rank builds the :class:`~trainer.train.Trainer`
from ``DIR/service.json`` (trainer section, loss, number of steps), resumes from the newest
checkpoint under ``DIR/checkpoints``, and then, for the next step n: waits for the batch file
of step n (:mod:`trainer.transport`), runs :meth:`Trainer.rl_step` on it, exports the policy
(rank 0 writes, then renames it into place), keeps the step's metrics, saves the trainer
state for exact resume and writes the done marker with the metrics, last. A checkpoint without its done marker
(a crash between the two) is finished on the next start by exporting again.

Each rank asks for SIGKILL when its parent (torchrun) dies, and watches the coordinator's PID
while it waits, so no rank outlives a killed coordinator.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from pydantic import Field

from protocol.config import Section
from protocol.lifetime import die_with_parent, parent_of
from trainer.config import LossConfig, TrainerSection
from trainer.transport import StepBatch, TrainDir, write_json_atomic

log = logging.getLogger("trainer.service")

SPEC_FILE = "service.json"
POLL_INTERVAL_S = 0.2
KEEP_CHECKPOINTS = 2


class ServiceSpec(Section):
    """What the coordinator tells its trainer service (written to ``<train dir>/service.json``)."""

    trainer: TrainerSection
    """Model (the start checkpoint), optimizer, parallelism, packing, checkpoint settings."""
    loss: LossConfig
    """The GRPO-family loss of every step."""
    num_steps: int = Field(ge=1)
    """Steps of the run (sizes the LR schedule; the service exits after the last)."""


def write_spec(train_dir: TrainDir, spec: ServiceSpec) -> None:
    write_json_atomic(train_dir.root / SPEC_FILE, spec.model_dump(mode="json"))


def _parent_alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_batch(train_dir: TrainDir, step: int, coordinator_pid: int | None) -> StepBatch:
    while True:
        batch = train_dir.read_batch(step)
        if batch is not None:
            return batch
        if not _parent_alive(coordinator_pid):
            raise SystemExit(f"coordinator {coordinator_pid} is gone; the trainer service stops")
        time.sleep(POLL_INTERVAL_S)


def _prune_checkpoints(directory: Path, keep: int) -> None:
    found = sorted(
        (p for p in directory.glob("step_*") if p.name.removeprefix("step_").isdigit()),
        key=lambda p: int(p.name.removeprefix("step_")),
    )
    for old in found[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def serve(train_dir: TrainDir, spec: ServiceSpec, coordinator_pid: int | None) -> None:
    from trainer.fsdp import barrier, shutdown
    from trainer.train import Trainer

    trainer = Trainer(spec.trainer, spec.num_steps)
    info = trainer.info

    def export_step(step: int) -> None:
        staging = train_dir.staging_policy_dir(step)
        if info.is_main and staging.exists():
            shutil.rmtree(staging)
        barrier(info)
        trainer.export(staging)
        if info.is_main:
            train_dir.install_policy(step)
        barrier(info)

    if trainer.resume(train_dir.checkpoints) and train_dir.read_done(trainer.step) is None:
        log.info("step %d was saved but not marked done; exporting its policy again", trainer.step)
        export_step(trainer.step)
        if info.is_main:
            saved = train_dir.read_metrics(trainer.step) or {"step": trainer.step}
            train_dir.write_done(trainer.step, {**saved, "recovered": True})
    log.info("trainer service rank %d/%d ready at step %d", info.rank, info.world_size, trainer.step)
    while trainer.step < spec.num_steps:
        step = trainer.step + 1
        batch = wait_for_batch(train_dir, step, coordinator_pid)
        metrics = trainer.rl_step(batch.samples, spec.loss, batch.temperature)
        export_step(step)
        if info.is_main:
            train_dir.write_metrics(step, metrics)
        trainer.save(train_dir.checkpoints)
        if info.is_main:
            _prune_checkpoints(train_dir.checkpoints, KEEP_CHECKPOINTS)
            train_dir.write_done(step, metrics)
            log.info("step %d trained: loss %.4f, reward %.3f", step, metrics["loss"], metrics["reward_mean"])
    shutdown(info)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-dir", type=Path, required=True, help="the run's transport directory")
    parser.add_argument("--coordinator-pid", type=int, default=None, help="stop when this process is gone")
    args = parser.parse_args(argv)
    die_with_parent(signal.SIGKILL)
    if args.coordinator_pid is not None and parent_of(os.getppid()) not in (args.coordinator_pid, None):
        # torchrun died before this rank asked to die with it (it is reparented): nobody will stop it.
        raise SystemExit(f"torchrun (launched by coordinator {args.coordinator_pid}) is gone; this rank stops")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    train_dir = TrainDir(args.train_dir)
    spec = ServiceSpec.model_validate_json((train_dir.root / SPEC_FILE).read_text())
    serve(train_dir, spec, args.coordinator_pid)


if __name__ == "__main__":
    main()
