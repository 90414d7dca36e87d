"""The trainer service: one torchrun job that trains every step the orchestrator hands it.

``torchrun --nproc-per-node N -m trainer.service --train-dir DIR`` (the coordinator launches it
once per run and keeps it up across steps). Each rank builds the :class:`~trainer.train.Trainer`
from ``DIR/service.json`` (trainer section, loss, number of steps), resumes from the newest
checkpoint under ``DIR/checkpoints``, and then, for the next step n: waits for the batch file
of step n (:mod:`trainer.transport`; rank 0 sleeps on the orchestrator's doorbell between
looks), runs :meth:`Trainer.rl_step` on it (or skips the step, or restores an earlier policy's
weights, as the batch says), exports the policy (rank 0 writes, then renames it
into place), keeps the step's metrics, saves the trainer state for exact resume (keeping the
newest ``checkpoint.keep``) and writes the done marker with the metrics, last. A checkpoint
without its done marker (a crash between the two) is finished on the next start by exporting again.
A step whose update trips a breaker (:mod:`trainer.breakers`) changes nothing: its done marker says why
(``tripped``) with the batch's attempt number, and the service waits for a later attempt of the same step
(a rebuilt batch, or a skip) from the orchestrator.
The coordinator removes the files of published steps (:meth:`TrainDir.prune_published`).

Each rank asks for SIGKILL when its parent (torchrun) dies, and the ranks on the coordinator's
machine watch its PID while they wait, so no rank there outlives a killed coordinator. The job
may span several machines (:mod:`trainer.launch`); ranks on the others have no coordinator PID
to watch. Instead rank 0 alone reads the batch and hands it (or "not yet") to every rank over a
gloo control group each poll, so when the ranks on the coordinator's machine die, the others'
next poll fails and their torchrun exits too. Rank 0 likewise decides whether a resumed step is
re-exported, so ranks never branch on what a lagging view of the shared filesystem shows.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from runtime.config import Section
from runtime.lifetime import die_with_parent, parent_of
from runtime.memory import release_free_memory
from trainer.config import BreakerConfig, LossConfig, TrainerSection
from trainer.launch import SPEC_FILE, check_train_dir
from trainer.transport import Doorbell, StepBatch, TrainDir, write_json_atomic

if TYPE_CHECKING:
    from trainer.fsdp import DistInfo
    from trainer.train import Trainer

log = logging.getLogger("trainer.service")

POLL_INTERVAL_S = 0.2
FAILPOINT_ENV = "PRIME_TRAINER_FAILPOINT"
"""Crash tests set it to ``<point>:<step>``: the rank SIGKILLs itself there (see :func:`failpoint`)."""
FAILPOINTS = ("batch", "trained", "exported", "metrics", "saved", "pruned")
"""The points of a step, in order, at which a crash leaves a different state on disk."""


class ServiceSpec(Section):
    """What the coordinator tells its trainer service (written to ``<train dir>/service.json``)."""

    trainer: TrainerSection
    """Model (the start checkpoint), optimizer, parallelism, packing, checkpoint settings."""
    loss: LossConfig
    """The GRPO-family loss of every step."""
    num_steps: int = Field(ge=1)
    """Steps of the run (sizes the LR schedule; the service exits after the last)."""
    breakers: BreakerConfig | None = None
    """The checks of each step's update before it is applied (None: none)."""
    behaviour_versions: int = Field(default=1, ge=1, le=64)
    """Policy versions the trainer keeps to recompute behaviour log-probabilities (`async_level` + 1), when
    `loss.behaviour_logprobs` is `recompute`."""


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


def _batch_after(train_dir: TrainDir, step: int, attempt: int) -> StepBatch | None:
    """Step ``step``'s batch if its attempt is later than ``attempt``."""
    batch = train_dir.read_batch(step)
    return batch if batch is not None and batch.attempt > attempt else None


def wait_for_batch(
    train_dir: TrainDir,
    step: int,
    coordinator_pid: int | None,
    info: DistInfo,
    group: Any,
    bell: Doorbell,
    after_attempt: int = 0,
) -> StepBatch:
    """Step ``step``'s batch on every rank, as rank 0 read it, of an attempt later than ``after_attempt``.

    Rank 0 looks for the file, and while it is not there waits on ``bell`` (rung by the orchestrator after it
    writes a batch) for at most POLL_INTERVAL_S before it looks again; the other ranks wait in the broadcast."""
    from trainer.fsdp import from_main

    while True:
        if not _parent_alive(coordinator_pid):
            raise SystemExit(f"coordinator {coordinator_pid} is gone; the trainer service stops")
        found = None
        if info.is_main:
            found = _batch_after(train_dir, step, after_attempt)
            if found is None and bell.wait(POLL_INTERVAL_S):
                found = _batch_after(train_dir, step, after_attempt)
        try:
            batch = from_main(found, info, group)
        except RuntimeError as exc:  # gloo: a peer's connection closed or reset
            raise SystemExit(f"rank {info.rank}: the trainer job lost a peer ({exc}); this rank stops") from exc
        if batch is not None:
            return batch


def failpoint(point: str, step: int) -> None:
    """SIGKILL this process at ``point`` of ``step`` when ``PRIME_TRAINER_FAILPOINT`` names them (crash tests)."""
    if os.environ.get(FAILPOINT_ENV) == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def run_batch(trainer: Trainer, batch: StepBatch, spec: ServiceSpec) -> dict[str, Any]:
    """Do what ``batch`` says with its step: train on it (the metrics say ``tripped`` when a breaker refused the
    update), skip it, or restore the weights it names."""
    if batch.action == "skip":
        return trainer.skip_step()
    if batch.action == "restore":
        if batch.restore_dir is None:
            raise ValueError(f"the restore batch of step {batch.step} names no policy to restore")
        return trainer.restore_step(Path(batch.restore_dir), batch.lr_scale)
    return trainer.rl_step(batch.samples, spec.loss, batch.temperature, spec.breakers)


def serve(train_dir: TrainDir, spec: ServiceSpec, coordinator_pid: int | None) -> None:
    from trainer.checkpoint import prune_checkpoints
    from trainer.fsdp import barrier, control_group, from_main, shutdown
    from trainer.train import Trainer

    trainer = Trainer(spec.trainer, spec.num_steps)
    if spec.loss.behaviour_logprobs == "recompute":
        trainer.keep_behaviour(spec.behaviour_versions)
    info = trainer.info
    group = control_group(info)

    def export_step(step: int) -> None:
        # a LoRA run's last step is also exported merged: the run's result, for what knows no adapters
        for merged in (False, True) if trainer.lora_enabled and step == spec.num_steps else (False,):
            staging = train_dir.staging_policy_dir(step, merged)
            if info.is_main and staging.exists():
                shutil.rmtree(staging)
            barrier(info)
            (trainer.export_merged if merged else trainer.export)(staging)
            if info.is_main:
                train_dir.install_policy(step, merged)
            barrier(info)

    resumed = trainer.resume(train_dir.checkpoints)
    if from_main(resumed and info.is_main and train_dir.read_done(trainer.step) is None, info, group):
        log.info("step %d was saved but not marked done; exporting its policy again", trainer.step)
        export_step(trainer.step)
        if info.is_main:
            saved = train_dir.read_metrics(trainer.step) or {"step": trainer.step}
            train_dir.write_done(trainer.step, {**saved, "recovered": True})
    host = socket.gethostname()
    log.info("trainer service rank %d/%d (%s) ready at step %d", info.rank, info.world_size, host, trainer.step)
    bell = Doorbell(train_dir.batch_bell)
    tripped_attempt = 0  # the last attempt of the next step that a breaker refused
    while trainer.step < spec.num_steps:
        step = trainer.step + 1
        batch = wait_for_batch(train_dir, step, coordinator_pid, info, group, bell, tripped_attempt)
        failpoint("batch", step)
        metrics = {**run_batch(trainer, batch, spec), "attempt": batch.attempt, "action": batch.action}
        if "tripped" in metrics:
            tripped_attempt = batch.attempt
            if info.is_main:
                train_dir.write_done(step, metrics)
                log.warning("step %d (attempt %d) not applied: %s", step, batch.attempt, "; ".join(metrics["tripped"]))
            continue
        tripped_attempt = 0
        failpoint("trained", step)
        exporting = time.perf_counter()
        export_step(step)
        metrics["export_s"] = time.perf_counter() - exporting
        failpoint("exported", step)
        if info.is_main:
            train_dir.write_metrics(step, metrics)
        failpoint("metrics", step)
        saving = time.perf_counter()
        trainer.save(train_dir.checkpoints)
        failpoint("saved", step)
        if info.is_main:
            prune_checkpoints(train_dir.checkpoints, spec.trainer.checkpoint.keep)
            failpoint("pruned", step)
            metrics["checkpoint_s"] = time.perf_counter() - saving
            train_dir.write_done(step, metrics)
        release_free_memory()  # the step's transient buffers, back to the OS
        if info.is_main and batch.action == "train":
            log.info(
                "step %d trained by %d ranks: loss %.4f, reward %.3f",
                step,
                metrics["world_size"],
                metrics["loss"],
                metrics["reward_mean"],
            )
        elif info.is_main:
            log.info("step %d: %s", step, "skipped" if batch.action == "skip" else f"restored {batch.restore_dir}")
    shutdown(info)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-dir", type=Path, required=True, help="the run's transport directory")
    parser.add_argument(
        "--coordinator-pid",
        type=int,
        default=None,
        help="stop when this process is gone (the coordinator's machine only; other nodes stop with rank 0)",
    )
    args = parser.parse_args(argv)
    die_with_parent(signal.SIGKILL)
    if args.coordinator_pid is not None and parent_of(os.getppid()) not in (args.coordinator_pid, None):
        # torchrun died before this rank asked to die with it (it is reparented): nobody will stop it.
        raise SystemExit(f"torchrun (launched by coordinator {args.coordinator_pid}) is gone; this rank stops")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    train_dir = TrainDir(args.train_dir)
    spec = ServiceSpec.model_validate_json(check_train_dir(train_dir.root).read_text())
    serve(train_dir, spec, args.coordinator_pid)


if __name__ == "__main__":
    main()
