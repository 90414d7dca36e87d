"""The coordinator's trainer child: one ``torchrun -m trainer.service`` job for the whole run.

Started once when the orchestrator starts and kept up across steps. It runs in a process
group of its own (so stopping it stops every rank) and dies with the coordinator
(``PR_SET_PDEATHSIG`` on torchrun, and on each rank towards torchrun), so a SIGKILLed
coordinator leaves no orphan ranks behind; a restarted coordinator starts a fresh one that
resumes from the last trainer checkpoint. With ``orchestrator.trainer_launch.nnodes`` > 1 this is node rank 0 of a
multi-node job (the other machines run ``prime-trainer node``; :mod:`trainer.launch`), and the
start checkpoint is first copied into the train dir, which every node shares. If the job exits while steps remain, the
orchestrator stops the run with :class:`ChildExitedError` naming the log to read (a crash
there is a bug or a lack of resources that a silent restart would only repeat).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.ledger.run_spec import run_precision, trainer_section
from coordinator.ledger.training_policy import behaviour_source
from runtime.children import Child, LogLimits, sharing_cores_env
from toploc.calibrations import run_thresholds
from trainer.launch import TrainerNode, torchrun_command
from trainer.resolve import resolve_model_path
from trainer.service import ServiceSpec, write_spec
from trainer.transport import TrainDir

SHARED_START_DIR = "start_checkpoint"


def trainer_node(config: CoordinatorConfig) -> TrainerNode:
    """Node rank 0 of the trainer job, as `[orchestrator.trainer_launch]` describes it (this machine hosts the
    rendezvous)."""
    launch = config.orchestrator.trainer_launch
    return TrainerNode(
        nproc_per_node=launch.nproc,
        nnodes=launch.nnodes,
        node_rank=0,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
    )


class TrainerProcess:
    def __init__(
        self,
        train_dir: TrainDir,
        spec: ServiceSpec,
        nproc: int,
        cpus: list[int] | None = None,
        node: TrainerNode | None = None,
        limits: LogLimits = LogLimits(),
    ) -> None:
        self.cpus = cpus or []
        self.limits = limits
        self.train_dir = train_dir
        self.spec = spec
        self.nproc = nproc
        self.node = node or TrainerNode(nproc_per_node=nproc)
        self.child: Child | None = None

    @classmethod
    def for_run(cls, config: CoordinatorConfig, train_dir: TrainDir) -> TrainerProcess:
        """The run's trainer job: node 0 of ``[orchestrator.trainer_launch]``, training the start checkpoint with the
        run's trainer section (:func:`coordinator.ledger.run_spec.trainer_section`), loss (its behaviour
        log-probabilities resolved, :func:`coordinator.ledger.training_policy.behaviour_source`), breakers and number
        of steps."""
        section = trainer_section(config, str(resolve_model_path(config.policy.start_checkpoint)))
        orchestrator = config.orchestrator
        breakers = orchestrator.breakers
        if breakers.draw_tolerance is None:  # the validators' calibrated tolerance of the run's precision
            tolerance = run_thresholds(run_precision(config))["sampling_tolerance"]
            breakers = breakers.model_copy(update={"draw_tolerance": tolerance})
        spec = ServiceSpec(
            trainer=section,
            loss=orchestrator.loss.model_copy(update={"behaviour_logprobs": behaviour_source(config)}),
            num_steps=orchestrator.num_steps,
            breakers=breakers,
            behaviour_versions=config.scheduling.async_level + 1,
        )
        launch = config.orchestrator.trainer_launch
        return cls(train_dir, spec, launch.nproc, launch.cpus, trainer_node(config), config.child_logs.limits())

    def command(self) -> list[str]:
        return torchrun_command(self.train_dir.root, self.node, os.getpid())

    def _share_start_checkpoint(self) -> None:
        """Copy the start checkpoint into the (shared) train dir so every node loads the same v0 weights."""
        source = Path(self.spec.trainer.model)
        shared = (self.train_dir.root / SHARED_START_DIR).resolve()
        if not shared.is_dir():
            partial = shared.with_name(f".{shared.name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial)
            partial.replace(shared)
        self.spec = self.spec.model_copy(
            update={"trainer": self.spec.trainer.model_copy(update={"model": str(shared)})}
        )

    def start(self) -> None:
        """Write the service spec and launch torchrun (from a thread that outlives the job)."""
        self.train_dir.root.mkdir(parents=True, exist_ok=True)
        if self.node.nnodes > 1:
            self._share_start_checkpoint()
        write_spec(self.train_dir, self.spec)
        self.child = Child(
            "trainer",
            self.command(),
            self.train_dir.log_path,
            env=sharing_cores_env(),
            cpus=self.cpus,
            own_group=True,
            limits=self.limits,
        )
        self.child.start()

    def check(self) -> None:
        """Raise :class:`ChildExitedError` when the job has exited."""
        if self.child is not None:
            self.child.check(
                f"the trainer service (torchrun, pid {self.child.pid})",
                "Fix the cause and start the coordinator again: it resumes from the last trainer checkpoint.",
            )

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.running

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the job's process group, then SIGKILL it if it does not exit in time."""
        if self.child is not None:
            self.child.stop(timeout_s)
