"""The RL loop of the coordinator: batches in, policies out, one step at a time.

For step s (1-based; step s turns policy v(s-1) into v(s)) the loop:

1. records the batch in the ledger (:meth:`TrainSteps.record_batch`: ``groups_per_step``
   accepted submissions not used before, made with a policy no older than s - 1 - k), or
   finds the one recorded before a restart; it waits while too few are accepted, woken by each
   verdict the ledger commits (:mod:`coordinator.ledger.changes`);
2. builds the samples (:meth:`TrainSteps.batch`: task prompt tokens, completion tokens, the
   worker's validated logprobs, the validator's rewards, group advantages) and writes them as the step's batch file for
   the trainer service (:mod:`trainer.transport`), unless the trainer already finished it;
3. waits for the trainer's done marker (woken by the trainer's doorbell), records the step as
   trained with its metrics, and publishes ``policies/step_s`` as version s through
   :func:`coordinator.loop.policies.publish_policy` (origin store, then ledger; idempotent; the
   origin store is then pruned), records it as published and removes the step files that published steps no longer need
   (:meth:`TrainDir.prune_published`, keeping ``orchestrator.keep_step_files``). The last step's policy is
   kept as the run's result (a LoRA run's: the merged model, and its adapter apart). The step's metrics also go
   to the run's metrics file (:mod:`coordinator.loop.run_metrics`), and a policy due an eval is queued
   (:mod:`coordinator.loop.evals`) before its files can be pruned.

Generation never waits for this loop: leasing goes on at the current version while the
trainer works (with k = 0 the ledger caps what is leased, see
:func:`coordinator.ledger.scheduling.lease_room`). Every step's state is in the ledger and the
run directory, so a restart anywhere in 1-3 resumes at the same step with the same batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from coordinator.config import CoordinatorConfig
from coordinator.ledger.batches import PromptImages, TurnPrompts, run_prompt_images, run_turn_prompts
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.step_metrics import step_metrics
from coordinator.ledger.train_steps import StepRecord, TrainSteps, min_policy_version
from coordinator.loop.evals import PolicyEvals
from coordinator.loop.policies import publish_policy
from coordinator.loop.run_metrics import RunMetricsFile
from coordinator.processes.trainer_process import TrainerProcess
from node.startup import eos_token_ids
from protocol.identity import NodeIdentity
from runtime.memory import release_free_memory
from shardcast.format.store import VersionStore
from trainer.resolve import resolve_model_path
from trainer.transport import Doorbell, StepBatch, TrainDir

log = logging.getLogger("coordinator.loop.orchestrator")
BATCH_WAKE_KINDS = ("verdict",)
"""Ledger events after which a step's batch may be complete: a submission accepted."""

T = TypeVar("T")


class StoppedError(Exception):
    """The coordinator is shutting down; the loop returns where it is (the ledger has the state)."""


@dataclass
class Orchestrator:
    config: CoordinatorConfig
    ledger: Ledger
    identity: NodeIdentity
    store: VersionStore
    train_dir: TrainDir
    trainer: TrainerProcess
    stop: threading.Event
    tick: Callable[[], None] = lambda: None
    """Called while waiting (progress lines, child-process checks); may raise to end the run."""
    metrics_file: RunMetricsFile | None = None
    """The run-long metrics file: a row per trained step (and the ledger's rows it lacks, at start)."""
    evals: PolicyEvals | None = None
    """Where the policies due an eval are queued as they are published."""
    steps: TrainSteps = field(init=False)
    turn_prompts: TurnPrompts = field(init=False)
    """Each policy turn's prompt of a rollout, rebuilt on the trusted side
    (:func:`coordinator.ledger.batches.run_turn_prompts`)."""
    prompt_images: PromptImages = field(init=False)
    """The images each rollout's prompt shows, rendered on the trusted side
    (:func:`coordinator.ledger.batches.run_prompt_images`)."""
    _done_bell: Doorbell = field(init=False)

    def __post_init__(self) -> None:
        self.steps = self.ledger.train_steps
        start_checkpoint = self.config.policy.start_checkpoint
        self.turn_prompts = run_turn_prompts(
            self.ledger.prompts, lambda: eos_token_ids(resolve_model_path(start_checkpoint))
        )
        self.prompt_images = run_prompt_images(self.ledger.prompts)
        self._done_bell = Doorbell(self.train_dir.done_bell)
        self._done_bell.listen()  # before the trainer can ring it

    def _wait(self, ready: Callable[[], T | None], wake: Callable[[float], object]) -> T:
        """``ready()`` once it is not None. In between, ``wake(timeout_s)`` blocks until what ``ready`` looks for
        may have changed (a ledger event, the trainer's doorbell) or at most ``poll_interval_s``, when the
        trainer's liveness, the stop flag and the progress line are looked at again."""
        while True:
            value = ready()
            if value is not None:
                return value
            if not self.trainer.running:
                value = ready()  # it may have finished its work and exited in between
                if value is not None:
                    return value
                self.trainer.check()
            self.tick()
            if self.stop.is_set():
                raise StoppedError
            wake(self.config.orchestrator.poll_interval_s)
            if self.stop.is_set():
                raise StoppedError

    def _on_ledger(
        self, look: Callable[[], T | None], kinds: tuple[str, ...]
    ) -> tuple[Callable[[], T | None], Callable[[float], object]]:
        """``look`` and the wake for :meth:`_wait` that ends at the commit of an event of ``kinds``; the mark is
        taken before each look, so an event committed between the look and the wait is not missed."""
        changes = self.ledger.changes
        mark = [changes.mark(kinds)]

        def ready() -> T | None:
            mark[0] = changes.mark(kinds)
            return look()

        return ready, lambda timeout_s: changes.wait(kinds, mark[0], timeout_s)

    def run(self) -> list[StepRecord]:
        """Train and publish the remaining steps; return every step's record."""
        settings = self.config.orchestrator
        first = self.steps.num_published() + 1
        if first > 1:
            log.info("resuming the RL loop at step %d of %d", first, settings.num_steps)
            self._retain(first - 1)  # a crash may have come between publishing and pruning
        if self.metrics_file is not None:
            self.metrics_file.sync(self.steps.steps(), self.ledger.clock())
        if first == 1 and self.evals is not None and self.evals.due(0):
            self.evals.submit(0, resolve_model_path(self.config.policy.start_checkpoint), copy=False)
        try:
            for step in range(first, settings.num_steps + 1):
                self.run_step(step)
        finally:
            self._done_bell.close()
        return self.steps.steps()

    def run_step(self, step: int) -> None:
        settings = self.config.orchestrator
        min_version = min_policy_version(step, self.config.scheduling.async_level)
        waiting_since = time.monotonic()
        record = self._wait(
            *self._on_ledger(
                lambda: self.steps.record_batch(step, settings.groups_per_step, min_version), BATCH_WAKE_KINDS
            )
        )
        if record.state == "published":
            return
        needed = self.train_dir.read_done(step) is None and not self.train_dir.has_batch(step)
        summary, samples = self.steps.batch(
            record, settings.normalize_std, self.turn_prompts, needed, self.prompt_images
        )
        if samples is not None:
            temperature = self.config.scheduling.temperature
            self.train_dir.write_batch(StepBatch(step, samples, temperature, record.submission_ids))
            log.info(
                "step %d: batch of %d groups (%d samples, staleness %.2f) after %.1f s",
                step,
                len(record.submission_ids),
                len(samples),
                summary["staleness_mean"],
                time.monotonic() - waiting_since,
            )
        done = self._wait(lambda: self.train_dir.read_done(step), self._done_bell.wait)
        if record.state == "recorded":
            metrics = step_metrics(done, summary)
            metrics["wait_s"] = time.monotonic() - waiting_since
            self.steps.mark_trained(step, metrics)
            if self.metrics_file is not None:
                self.metrics_file.append("step", step, self.ledger.clock(), metrics)
        publish_policy(self.train_dir.policy_dir(step), step, self.identity, self.store, self.ledger, self.config)
        if step == settings.num_steps:  # the run's result: kept whole, apart from the step files pruning removes
            lora = self.config.orchestrator.trainer.lora.enabled
            adapter_dir = self.config.final_adapter_dir if lora else None
            self.train_dir.keep_result(step, self.config.final_policy_dir, adapter_dir)
        self.steps.mark_published(step)
        if self.evals is not None and self.evals.due(step):
            self.evals.submit(step, self.train_dir.policy_dir(step))
        self._retain(step)
        release_free_memory()  # the step's batch and groups are garbage now: keep a long run's RSS flat
        log.info("step %d trained and published as policy v%d", step, step)

    def _retain(self, published: int) -> None:
        removed = self.train_dir.prune_published(published, self.config.orchestrator.keep_step_files)
        if removed:
            log.debug("step %d published: removed %d step files from %s", published, len(removed), self.train_dir.root)
