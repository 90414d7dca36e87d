"""The RL loop of the coordinator: batches in, policies out, one step at a time.

For step s (1-based; step s turns policy v(s-1) into v(s)) the loop:

1. records the batch in the ledger (:meth:`TrainSteps.record_batch`: ``groups_per_step``
   accepted submissions not used before that carry signal, made with a policy no older than s - 1 - k
   nor than the last rollback), or finds the one recorded before a restart; it waits while too few are
   accepted, woken by each verdict the ledger commits (:mod:`coordinator.ledger.changes`). A rollback
   asked for (by the canary, :mod:`coordinator.loop.canary`, or ``prime-coordinator rollback``) makes
   the step a restore of that version's weights instead;
2. builds the samples (:meth:`TrainSteps.batch`: task prompt tokens, completion tokens, the
   policy version that sampled them, the worker's logprobs, the validator's rewards, group advantages; groups
   without signal left out) and writes them as the step's batch file for
   the trainer service (:mod:`trainer.transport`), unless the trainer already finished it;
3. waits for the trainer's done marker (woken by the trainer's doorbell). A breaker that refused the update
   (``tripped``) has the step's groups audited again in full, then the batch rebuilt from what stands, or the
   step skipped when nothing was caught, each as the step's next attempt (:meth:`Orchestrator._after_trip`);
   ``orchestrator.max_consecutive_trips`` refusals in a row pause the run (:class:`RunPausedError`). A submission whose
   claimed log-probabilities the trainer found far from its own is audited again too, without stopping the step.
   Then it records the step as
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
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from coordinator.config import CoordinatorConfig
from coordinator.ledger.batches import BatchRules, PromptImages, TurnPrompts, run_prompt_images, run_turn_prompts
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.step_metrics import step_metrics
from coordinator.ledger.train_steps import StepRecord, TrainSteps, min_policy_version
from coordinator.ledger.training_policy import behaviour_source, every_sample_audited
from coordinator.loop.evals import PolicyEvals
from coordinator.loop.policies import publish_policy
from coordinator.loop.run_metrics import RunMetricsFile
from coordinator.processes.trainer_process import TrainerProcess
from node.startup import eos_token_ids
from protocol.errors import RunPausedError
from protocol.identity import NodeIdentity
from runtime.memory import release_free_memory
from shardcast.format.store import VersionStore
from trainer.resolve import resolve_model_path
from trainer.transport import Doorbell, StepBatch, TrainDir

log = logging.getLogger("coordinator.loop.orchestrator")
BATCH_WAKE_KINDS = ("verdict",)
"""Ledger events after which a step's batch may be complete: a submission accepted."""
OFF_DRAW_REASON = "the trainer's replay: tokens that are not the policy's seeded draw"
REAUDIT_WAKE_KINDS = ("reaudit",)
"""Ledger events after which a refused step's re-audits may be decided."""

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
    rules: BatchRules = field(init=False)
    """How the step's groups become samples: the no-signal filter, and under ``sampler`` behaviour log-probabilities
    with a partial audit, only the samples a validator recomputed."""
    consecutive_trips: int = 0
    """Refused attempts since the last applied step (or since this coordinator started)."""
    _done_bell: Doorbell = field(init=False)

    def __post_init__(self) -> None:
        self.steps = self.ledger.train_steps
        start_checkpoint = self.config.policy.start_checkpoint
        self.turn_prompts = run_turn_prompts(
            self.ledger.prompts, lambda: eos_token_ids(resolve_model_path(start_checkpoint))
        )
        self.prompt_images = run_prompt_images(self.ledger.prompts)
        settings = self.config.orchestrator
        self.rules = BatchRules(
            normalize_std=settings.normalize_std,
            no_signal_filter=settings.no_signal_filter,
            checked_only=behaviour_source(self.config) == "sampler"
            and not every_sample_audited(self.config.validation),
        )
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

    def unfinished_rollback(self) -> None:
        """Say so when a rollback was asked for after the last step (an eval of a late version fell): the run's
        result stays its last policy, and the weights the rollback would have restored are kept."""
        request = self.steps.rollback_request()
        if request is not None:
            print(
                f"a rollback to v{request.to_version} was asked for after the last step ({request.reason}); the run's "
                f"result stays v{self.config.orchestrator.num_steps}, and v{request.to_version}'s weights are kept "
                f"in {request.source_dir}",
                flush=True,
            )

    def min_version(self, step: int) -> int:
        """The oldest policy version step ``step`` may learn from: the async level's bound, and never a version
        older than the last rollback's (the versions it undid)."""
        return max(min_policy_version(step, self.config.scheduling.async_level), self.steps.version_floor())

    def _no_signal_scan(self) -> int | None:
        settings = self.config.orchestrator
        return settings.no_signal_scan if settings.no_signal_filter else None

    def _record(self, step: int) -> StepRecord | None:
        """Step ``step``'s record: a restore when a rollback is asked for, else its batch (None while too few)."""
        request = self.steps.rollback_request()
        if request is not None:
            return self.steps.record_restore(step, request)
        settings = self.config.orchestrator
        return self.steps.record_batch(step, settings.groups_per_step, self.min_version(step), self._no_signal_scan())

    def run_step(self, step: int) -> None:
        settings = self.config.orchestrator
        waiting_since = time.monotonic()
        evals = self.evals
        if settings.canary.hold_steps and evals is not None and not evals.idle:  # the canary acts before the step
            self._wait(lambda: True if evals.idle else None, lambda timeout_s: self.stop.wait(timeout_s))
        record = self._wait(*self._on_ledger(lambda: self._record(step), BATCH_WAKE_KINDS))
        if record.state == "published":
            return
        record, done, summary = self._train(step, record, waiting_since)
        if record.state == "recorded":
            metrics = {**record.metrics, **step_metrics(_step_figures(done), summary)}  # a rollback's request kept
            metrics["wait_s"] = time.monotonic() - waiting_since
            metrics["step_kind"] = record.kind
            metrics["breaker_trips"] = len(record.trips)
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
        log.info("step %d %s and published as policy v%d", step, _DONE_AS[record.kind], step)
        if record.kind == "restore":
            self._restored(step, record)
        elif record.kind == "train":  # an applied update ends a run of refusals; a skip does not
            self.consecutive_trips = 0

    def _restored(self, step: int, record: StepRecord) -> None:
        """After a rollback's step is published: its kept weights go, and a rollback set to pause pauses the run."""
        request = record.metrics.get("rollback", {})
        source = request.get("source_dir")
        if source:
            shutil.rmtree(source, ignore_errors=True)
        print(f"rolled back: v{step} holds the weights of v{record.restore_version} ({request.get('reason', '')})")
        if request.get("pause"):
            raise RunPausedError(
                f"the run paused after rolling back to v{record.restore_version} (published as v{step}): "
                f"{request.get('reason', '')}; look at the evals, then start the coordinator again to go on"
            )

    def _needs_batch(self, step: int, attempt: int) -> bool:
        """Whether the trainer still needs attempt ``attempt`` of step ``step``: neither done nor written."""
        done = self.train_dir.read_done(step)
        if done is not None and done.get("attempt", 1) == attempt:
            return False
        return self.train_dir.batch_attempt(step) != attempt

    def _write_batch(self, step: int, record: StepRecord, waiting_since: float) -> tuple[StepRecord, dict[str, float]]:
        """The step's batch figures; the batch file of the record's attempt written when the trainer needs it. A
        batch left with nothing to learn from (every group filtered out) makes the step a skip."""
        needed = self._needs_batch(step, record.attempt)
        temperature = self.config.scheduling.temperature
        if record.kind == "restore":
            request = record.metrics.get("rollback", {})
            if needed:
                restore = StepBatch(step, [], temperature, [], record.attempt, "restore")
                restore = replace(restore, restore_dir=request["source_dir"], lr_scale=request.get("lr_scale", 1.0))
                self.train_dir.write_batch(restore)
            return record, {}
        summary, samples = self.steps.batch(record, self.rules, self.turn_prompts, needed, self.prompt_images)
        if record.kind == "skip" or (samples is not None and not samples):
            if record.kind != "skip":
                log.warning("step %d: no sample of its batch carries a signal; the step is skipped", step)
                record = self.steps.skip(step)
            if self._needs_batch(step, record.attempt):
                skip = StepBatch(step, [], temperature, record.submission_ids, record.attempt, "skip")
                self.train_dir.write_batch(skip)
            return record, summary
        if samples is not None:
            self.train_dir.write_batch(StepBatch(step, samples, temperature, record.submission_ids, record.attempt))
            log.info(
                "step %d: batch of %d groups (%d samples, staleness %.2f, %.0f%% of groups without signal) after %.1fs",
                step,
                len(record.submission_ids),
                len(samples),
                summary["staleness_mean"],
                100 * summary["zero_signal_fraction"],
                time.monotonic() - waiting_since,
            )
        return record, summary

    def _train(
        self, step: int, record: StepRecord, waiting_since: float
    ) -> tuple[StepRecord, dict[str, Any], dict[str, float]]:
        """Hand the step to the trainer until an attempt is applied: (its record, the done marker, batch figures)."""
        while True:
            record, summary = self._write_batch(step, record, waiting_since)
            done = self._wait(partial(self._done_of, step, record.attempt), self._done_bell.wait)
            if "tripped" not in done:
                self._reaudit_suspects(step, record, done)
                return record, done, summary
            record = self._after_trip(step, record, done)

    def _done_of(self, step: int, attempt: int) -> dict[str, Any] | None:
        done = self.train_dir.read_done(step)
        return done if done is not None and done.get("attempt", 1) == attempt else None

    def _reaudit_suspects(self, step: int, record: StepRecord, done: dict[str, Any]) -> None:
        """Audit again in full each submission whose claimed log-probabilities the trainer found past
        ``orchestrator.claim_tolerance`` from its own (they never entered the loss)."""
        errors = done.get("claim_errors") or []
        groups = done.get("claim_groups") or []
        tolerance = self.config.orchestrator.claim_tolerance
        suspects = sorted({record.submission_ids[g] for g, e in zip(groups, errors, strict=False) if e > tolerance})
        if suspects and self.steps.request_reaudit(suspects):
            log.warning(
                "step %d: %d submission(s) claimed log-probabilities more than %g from the trainer's; auditing them "
                "again in full: %s",
                step,
                len(suspects),
                tolerance,
                ", ".join(suspects[:4]),
            )

    def _after_trip(self, step: int, record: StepRecord, done: dict[str, Any]) -> StepRecord:
        """A breaker refused attempt ``record.attempt``: record why, audit the step's groups again in full, and
        return the next attempt: the batch rebuilt without what the re-audit caught, or a skip when it caught
        nothing (or could not decide within ``orchestrator.reaudit_timeout_s``). RunPausedError after
        ``orchestrator.max_consecutive_trips`` refusals in a row."""
        settings = self.config.orchestrator
        reasons = [str(reason) for reason in done["tripped"]]
        first_time = self.steps.record_trip(step, record.attempt, reasons)
        ids = record.submission_ids
        off_draw = sorted({ids[g] for g in done.get("off_draw_groups") or [] if 0 <= g < len(ids)})
        if first_time:
            self.consecutive_trips += 1
            refused = f"step {step}: the update was refused ({'; '.join(reasons)})"
            if off_draw:  # the trainer's own replay is the evidence: no validator is asked again
                caught = self.ledger.caught_by_trainer(off_draw, OFF_DRAW_REASON)
                print(f"{refused}; caught {len(caught)} submission(s) whose tokens are not the policy's draw")
            else:
                print(f"{refused}; auditing its {len(ids)} groups again")
                self.steps.request_reaudit(ids)
        if self.consecutive_trips >= settings.max_consecutive_trips:
            raise RunPausedError(
                f"the run paused at step {step}: {self.consecutive_trips} updates in a row were refused "
                f"(last: {'; '.join(reasons)}); read the trips on the dashboard, raise orchestrator.breakers if they "
                "are honest, or roll back (prime-coordinator rollback --to vN), then start the coordinator again"
            )
        if off_draw:
            return self._rebuilt(step, off_draw)
        states = self._reaudits_decided(ids, settings.reaudit_timeout_s)
        failed = sorted(sid for sid, state in states.items() if state == "failed")
        if not failed:
            undecided = sum(state not in ("passed", "failed") for state in states.values())
            log.warning(
                "step %d: the re-audit caught nothing (%d undecided); the refusal is unexplained and the step skipped",
                step,
                undecided,
            )
            return self.steps.skip(step)
        log.warning(
            "step %d: the re-audit caught %d submission(s); rebuilding the batch without them", step, len(failed)
        )
        return self._rebuilt(step, failed)

    def _rebuilt(self, step: int, failed: list[str]) -> StepRecord:
        """The step's next attempt: its batch without ``failed``, filled again from the accepted pool."""
        min_version, scan = self.min_version(step), self._no_signal_scan()
        groups = self.config.orchestrator.groups_per_step

        def rebuilt() -> StepRecord | None:
            return self.steps.rebuild_batch(step, failed, groups, min_version, scan)

        return self._wait(*self._on_ledger(rebuilt, BATCH_WAKE_KINDS))

    def _reaudits_decided(self, ids: list[str], timeout_s: float) -> dict[str, str]:
        """Each submission's re-audit state once none is pending, or as it is after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s

        def decided() -> dict[str, str] | None:
            states = self.steps.reaudit_states(ids)
            if time.monotonic() >= deadline or all(states.get(sid) not in (None, "pending") for sid in ids):
                return states
            return None

        return self._wait(*self._on_ledger(decided, REAUDIT_WAKE_KINDS))

    def _retain(self, published: int) -> None:
        removed = self.train_dir.prune_published(published, self.config.orchestrator.keep_step_files)
        if removed:
            log.debug("step %d published: removed %d step files from %s", published, len(removed), self.train_dir.root)


_DONE_AS = {"train": "trained", "skip": "skipped", "restore": "restored an earlier version"}

_TRANSIENT = ("claim_errors", "claim_groups", "off_draw_groups", "tripped")
"""Done-marker entries the loop reads and does not keep with the step's metrics (one number per sample)."""


def _step_figures(done: dict[str, Any]) -> dict[str, Any]:
    """The trainer's metrics of a step as the ledger keeps them."""
    return {key: value for key, value in done.items() if key not in _TRANSIENT}
