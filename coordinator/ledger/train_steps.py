"""The orchestrator's record in the ledger: which accepted submissions make up which training step.

A step goes ``recorded -> trained -> published``. :meth:`TrainSteps.record_batch` picks the
step's submissions and records them in the same transaction that creates the step, before
any training: ``step_submissions`` is keyed by submission id, so an accepted rollout is used
in at most one step, and a restarted coordinator finds the recorded batch and trains it
again instead of choosing a new one. Candidates are accepted submissions not used before,
made with a policy version no older than the step allows (the async level, and never one a
rollback undid), oldest accepted first, whose verdict carries a reward for every rollout.
With the no-signal filter a candidate whose groups all have equal rewards is set aside for the
step (``no_signal_groups``: credited, never trained, no longer in flight) and does not count
towards its size, up to a bound after which the step takes what comes.

A step's ``kind`` says what it does: ``train`` on its batch, ``skip`` (its policy is the previous
one's: a batch a breaker refused that re-audit could not explain) or ``restore`` an earlier version's
weights (a rollback, :meth:`TrainSteps.record_restore`; the steps it undoes are marked
``rolled_back``). A batch a breaker refused is recorded with its reasons (:meth:`TrainSteps.record_trip`),
its groups are audited again in full (:meth:`TrainSteps.request_reaudit`), and it is rebuilt from what
stands (:meth:`TrainSteps.rebuild_batch`) or the step skipped, each as the step's next ``attempt``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sqlalchemy import Connection, Row, Select, delete, func, insert, select, update

from coordinator.ledger import reaudits
from coordinator.ledger.audit_choice import audit_sample_indices
from coordinator.ledger.batches import (
    AcceptedGroup,
    BatchRules,
    PromptImages,
    TurnPrompts,
    accepted_group,
    batch_summary,
    has_signal,
    prompt_rewards,
    sampled_fraction,
    text_images,
    train_samples,
    verdict_rewards,
)
from coordinator.ledger.core import LedgerCore
from coordinator.ledger.resting import PromptSignal, after_group, prompt_key
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import (
    accepted_groups,
    events,
    leases,
    no_signal_groups,
    prompt_signal,
    run_state,
    step_submissions,
    submissions,
    tasks,
    train_steps,
)
from protocol.errors import ConfigError
from protocol.schemas import SubmitRequest
from trainer.transport import TrainSample

CANDIDATE_SCAN_FACTOR = 4
StepKind = Literal["train", "skip", "restore"]

PUBLISHED_STEPS = select(func.count()).where(train_steps.c.state == "published")
"""How many training steps the RL loop has published (the status's count, and the run's end)."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    state: str
    min_policy_version: int
    submission_ids: list[str]
    metrics: dict[str, Any]
    kind: StepKind = "train"
    attempt: int = 1
    restore_version: int | None = None
    """``restore``: the version whose weights the step publishes again."""
    rolled_back: bool = False
    """A later rollback undid this step."""
    trips: list[dict[str, Any]] = field(default_factory=list)
    """Each refused attempt: ``attempt``, ``reasons``, ``at``."""


@dataclass(frozen=True)
class Candidate:
    """An accepted submission a step may take, with the signal of each of its prompts' groups (by prompt key)."""

    submission_id: str
    groups: dict[str, bool]

    @property
    def signal(self) -> bool:
        return any(self.groups.values())


@dataclass(frozen=True)
class RollbackRequest:
    """A rollback asked for and not yet done: the next step publishes ``to_version``'s weights again."""

    to_version: int
    reason: str
    lr_scale: float = 1.0
    pause: bool = False
    """Pause the run once the rollback is published."""
    source_dir: str = ""
    """Where the weights to restore were kept when the rollback was asked for."""

    def as_json(self) -> dict[str, Any]:
        return {
            "to_version": self.to_version,
            "reason": self.reason,
            "lr_scale": self.lr_scale,
            "pause": self.pause,
            "source_dir": self.source_dir,
        }


def min_policy_version(step: int, async_level: int) -> int:
    """Oldest policy version step ``step`` may learn from: the policy it trains (step - 1) minus k."""
    return max(0, step - 1 - async_level)


def trained_steps_and_evals(db: Database) -> tuple[Sequence[Row[Any, Any, Any, Any]], Sequence[Row[Any, Any, Any]]]:
    """Every trained step (``step``, ``trained_at``, ``published_at``, ``metrics_json``) in step order, and every
    ``train_step`` event that may carry an eval (``at``, ``subject``, ``data_json``) in log order; one snapshot."""
    with db.read() as conn:
        steps = conn.execute(
            select(train_steps.c.step, train_steps.c.trained_at, train_steps.c.published_at, train_steps.c.metrics_json)
            .where(train_steps.c.state != "recorded")
            .order_by(train_steps.c.step)
        ).all()
        logged = conn.execute(
            select(events.c.at, events.c.subject, events.c.data_json)
            .where(events.c.kind == "train_step")
            .where(events.c.data_json.contains('"evaluated"'))
            .order_by(events.c.event_id)
        ).all()
    return steps, logged


class TrainSteps:
    """Reads and writes the orchestrator's tables over the ledger's :class:`~coordinator.ledger.core.LedgerCore`."""

    def __init__(self, core: LedgerCore) -> None:
        self.core = core
        self.db = core.db

    def _record(self, conn: Connection, row: Any) -> StepRecord:
        ids = conn.execute(
            select(step_submissions.c.submission_id)
            .where(step_submissions.c.step == row.step)
            .order_by(step_submissions.c.position)
        ).scalars()
        return StepRecord(
            step=row.step,
            state=row.state,
            min_policy_version=row.min_policy_version,
            submission_ids=list(ids),
            metrics=json.loads(row.metrics_json) if row.metrics_json else {},
            kind=row.kind,
            attempt=row.attempt,
            restore_version=row.restore_version,
            rolled_back=bool(row.rolled_back),
            trips=json.loads(row.trips_json) if row.trips_json else [],
        )

    def steps(self) -> list[StepRecord]:
        with self.db.read() as conn:
            rows = conn.execute(select(train_steps).order_by(train_steps.c.step)).all()
            return [self._record(conn, row) for row in rows]

    def step(self, step: int) -> StepRecord | None:
        with self.db.read() as conn:
            row = conn.execute(select(train_steps).where(train_steps.c.step == step)).first()
            return None if row is None else self._record(conn, row)

    def _candidates(self, conn: Connection, min_version: int, limit: int) -> list[Candidate]:
        """Up to ``limit`` unused accepted submissions of ``min_version`` or later that a step may take, oldest
        accepted first, each with which of its prompts' groups carry signal."""
        rows = conn.execute(
            select(
                submissions.c.submission_id, submissions.c.body_json, submissions.c.verdict_json, tasks.c.prompts_json
            )
            .join(accepted_groups, accepted_groups.c.submission_id == submissions.c.submission_id)
            .join(tasks, tasks.c.task_id == submissions.c.task_id)
            .where(
                submissions.c.status == "accepted",
                submissions.c.policy_version >= min_version,
                submissions.c.submission_id.not_in(select(step_submissions.c.submission_id)),
                submissions.c.submission_id.not_in(select(no_signal_groups.c.submission_id)),
            )
            .order_by(accepted_groups.c.accepted_at, submissions.c.submission_id)
            .limit(limit)
        ).all()
        found = []
        for row in rows:
            submission = SubmitRequest.model_validate_json(row.body_json)
            rewards = verdict_rewards(row.verdict_json, len(submission.rollouts))
            if rewards is None:
                continue
            keys = {int(p["prompt_index"]): prompt_key(p["token_ids"]) for p in json.loads(row.prompts_json)}
            groups = prompt_rewards(submission, rewards)
            found.append(Candidate(row.submission_id, {keys[i]: has_signal(group) for i, group in groups.items()}))
        return found

    def _choose(
        self, conn: Connection, step: int, wanted: int, min_version: int, no_signal_scan: int | None
    ) -> list[Candidate]:
        """Up to ``wanted`` submissions for step ``step``. With ``no_signal_scan`` (the filter on), candidates without
        signal are set aside for the step at once (they leave the pool even while the step waits) until the step has
        set aside ``(no_signal_scan - 1) x wanted``; then candidates are taken whatever they carry."""
        candidates = self._candidates(conn, min_version, max(wanted, 1) * CANDIDATE_SCAN_FACTOR)
        if no_signal_scan is None:
            return candidates[:wanted]
        bound = (no_signal_scan - 1) * wanted
        set_aside = conn.execute(
            select(func.count()).select_from(no_signal_groups).where(no_signal_groups.c.step == step)
        ).scalar_one()
        chosen: list[Candidate] = []
        for candidate in candidates:
            if len(chosen) == wanted:
                break
            if candidate.signal or set_aside >= bound:
                chosen.append(candidate)
                continue
            values = {"submission_id": candidate.submission_id, "step": step, "set_aside_at": self.core.clock()}
            conn.execute(insert(no_signal_groups).values(**values))
            self._note_signal(conn, [candidate])
            set_aside += 1
        return chosen

    def _note_signal(self, conn: Connection, taken: list[Candidate]) -> None:
        """Count each taken group's signal towards its prompt's rest (:mod:`coordinator.ledger.resting`)."""
        settings = self.core.config.orchestrator
        if settings.rest_after <= 0 or not taken:
            return
        next_group = self.core.next_group_index(conn)
        for candidate in taken:
            for key, signal in candidate.groups.items():
                row = conn.execute(select(prompt_signal).where(prompt_signal.c.prompt_key == key)).first()
                state = PromptSignal(row.no_signal_in_a_row, row.resting_until) if row else PromptSignal(0, 0)
                after = after_group(state, signal, next_group, settings.rest_after, settings.rest_groups)
                values = {"no_signal_in_a_row": after.no_signal_in_a_row, "resting_until": after.resting_until}
                if row is None:
                    conn.execute(insert(prompt_signal).values(prompt_key=key, **values))
                elif after != state:
                    conn.execute(update(prompt_signal).where(prompt_signal.c.prompt_key == key).values(**values))

    def record_batch(
        self, step: int, groups_per_step: int, min_version: int, no_signal_scan: int | None = None
    ) -> StepRecord | None:
        """Record step ``step``'s batch (or return the one already recorded); None while too few groups.
        ``no_signal_scan``: the no-signal filter's bound (None: off; see :meth:`_choose`)."""
        with self.core.write(None) as conn:
            self.core.run_row(conn, lock=True)  # one recorder at a time, also across API replicas
            existing = conn.execute(select(train_steps).where(train_steps.c.step == step)).first()
            if existing is not None:
                return self._record(conn, existing)
            taken = self._choose(conn, step, groups_per_step, min_version, no_signal_scan)
            if len(taken) < groups_per_step:
                return None
            self._note_signal(conn, taken)
            chosen = [candidate.submission_id for candidate in taken]
            now = self.core.clock()
            conn.execute(
                insert(train_steps).values(
                    step=step,
                    state="recorded",
                    min_policy_version=min_version,
                    recorded_at=now,
                    kind="train",
                    attempt=1,
                    rolled_back=False,
                )
            )
            conn.execute(
                insert(step_submissions),
                [{"submission_id": sid, "step": step, "position": i} for i, sid in enumerate(chosen)],
            )
            self.core.event(
                conn, "train_step", self.core.coordinator_id, str(step), state="recorded", submission_ids=chosen
            )
            row = conn.execute(select(train_steps).where(train_steps.c.step == step)).one()
            return self._record(conn, row)

    def record_trip(self, step: int, attempt: int, reasons: list[str]) -> bool:
        """Record that a breaker refused attempt ``attempt`` of step ``step`` and why; False when it was recorded
        already (a restarted coordinator handling the same refusal again)."""
        with self.core.write(None) as conn:
            row = conn.execute(select(train_steps).where(train_steps.c.step == step).with_for_update()).one()
            trips = json.loads(row.trips_json) if row.trips_json else []
            if any(trip["attempt"] == attempt for trip in trips):
                return False
            trips.append({"attempt": attempt, "reasons": reasons[:8], "at": self.core.clock()})
            conn.execute(update(train_steps).where(train_steps.c.step == step).values(trips_json=json.dumps(trips)))
            self.core.event(
                conn, "breaker_trip", self.core.coordinator_id, str(step), attempt=attempt, reasons=reasons[:8]
            )
            return True

    def request_reaudit(self, submission_ids: list[str]) -> list[str]:
        """Have validators recompute every sample of these accepted submissions again (a refused step's groups);
        the ones asked for (those still accepted)."""
        now = self.core.clock()
        with self.core.write(None) as conn:
            rows = conn.execute(
                select(submissions.c.submission_id, submissions.c.node_id, submissions.c.body_json)
                .where(submissions.c.submission_id.in_(submission_ids), submissions.c.status == "accepted")
                .with_for_update()
            ).all()
            for row in rows:
                reaudits.request_full(
                    conn, row.submission_id, row.node_id, len(json.loads(row.body_json)["rollouts"]), now
                )
            return [row.submission_id for row in rows]

    def reaudit_states(self, submission_ids: list[str]) -> dict[str, str]:
        """Each submission's re-audit state (``pending``, ``passed``, ``failed``, ...); absent: none."""
        return reaudits.states(self.db, submission_ids)

    def rebuild_batch(
        self, step: int, failed: list[str], groups_per_step: int, min_version: int, no_signal_scan: int | None
    ) -> StepRecord | None:
        """Step ``step``'s next attempt: the submissions in ``failed`` (a re-audit caught them) voided and out of the
        step, the others kept, and as many new candidates as it takes to fill it again; None (and the voided ones
        gone) while too few are accepted."""
        with self.core.write(None) as conn:
            self.core.run_row(conn, lock=True)
            row = conn.execute(select(train_steps).where(train_steps.c.step == step).with_for_update()).one()
            if failed:
                conn.execute(delete(step_submissions).where(step_submissions.c.submission_id.in_(failed)))
                reaudits.void_submissions(
                    conn, failed, "a full re-audit of its refused training step failed", self.core.clock()
                )
            kept = list(
                conn.execute(
                    select(step_submissions.c.submission_id)
                    .where(step_submissions.c.step == step)
                    .order_by(step_submissions.c.position)
                ).scalars()
            )
            taken = self._choose(conn, step, groups_per_step - len(kept), min_version, no_signal_scan)
            self._note_signal(conn, taken)
            more = [candidate.submission_id for candidate in taken]
            if len(kept) + len(more) < groups_per_step:
                if more:  # keep them for this step while it waits for the rest
                    self._append(conn, step, kept, more)
                return None
            self._append(conn, step, kept, more)
            conn.execute(update(train_steps).where(train_steps.c.step == step).values(attempt=row.attempt + 1))
            chosen = [*kept, *more]
            self.core.event(
                conn,
                "train_step",
                self.core.coordinator_id,
                str(step),
                state="recorded",
                attempt=row.attempt + 1,
                submission_ids=chosen,
            )
            return self._record(conn, conn.execute(select(train_steps).where(train_steps.c.step == step)).one())

    @staticmethod
    def _append(conn: Connection, step: int, kept: list[str], more: list[str]) -> None:
        if more:
            conn.execute(
                insert(step_submissions),
                [{"submission_id": sid, "step": step, "position": len(kept) + i} for i, sid in enumerate(more)],
            )
            kept.extend(more)

    def skip(self, step: int) -> StepRecord:
        """Step ``step``'s next attempt is a skip: its policy is the previous one's (its groups stay used)."""
        with self.core.write(None) as conn:
            row = conn.execute(select(train_steps).where(train_steps.c.step == step).with_for_update()).one()
            if row.kind != "skip":
                values = {"kind": "skip", "attempt": row.attempt + 1}
                conn.execute(update(train_steps).where(train_steps.c.step == step).values(**values))
                self.core.event(conn, "train_step", self.core.coordinator_id, str(step), state="skipped")
            return self._record(conn, conn.execute(select(train_steps).where(train_steps.c.step == step)).one())

    def request_rollback(self, request: RollbackRequest) -> None:
        """Ask for a rollback to ``request.to_version`` (done by the RL loop before its next step); ConfigError, with
        what to ask for instead, when that version was never published or a rollback undid it."""
        with self.core.write(None) as conn:
            run = self.core.run_row(conn, lock=True)
            target = request.to_version
            if not 0 <= target <= run.current_policy_version:
                raise ConfigError(
                    f"cannot roll back to v{target}: the run has published v0 to v{run.current_policy_version}"
                )
            undone = conn.execute(
                select(train_steps.c.step).where(train_steps.c.step == target, train_steps.c.rolled_back)
            ).first()
            if undone is not None:
                raise ConfigError(f"cannot roll back to v{target}: a rollback undid it; pick a version it kept")
            value = request.as_json()
            conn.execute(update(run_state).values(rollback_json=json.dumps(value)))
            self.core.event(conn, "rollback", self.core.coordinator_id, f"v{target}", state="requested", **value)

    def rollback_request(self) -> RollbackRequest | None:
        with self.db.read() as conn:
            value = conn.execute(select(run_state.c.rollback_json)).scalar()
        return None if not value else RollbackRequest(**json.loads(value))

    def record_restore(self, step: int, request: RollbackRequest) -> StepRecord:
        """Step ``step`` restores ``request.to_version`` (or the step already recorded): the steps after that version
        are marked rolled back and the request is done, in one transaction."""
        with self.core.write(None) as conn:
            self.core.run_row(conn, lock=True)
            existing = conn.execute(select(train_steps).where(train_steps.c.step == step)).first()
            if existing is not None:
                return self._record(conn, existing)
            target = request.to_version
            conn.execute(
                insert(train_steps).values(
                    step=step,
                    state="recorded",
                    min_policy_version=step,
                    recorded_at=self.core.clock(),
                    kind="restore",
                    attempt=1,
                    restore_version=target,
                    rolled_back=False,
                    metrics_json=json.dumps({"rollback": request.as_json()}),
                )
            )
            undone = conn.execute(
                update(train_steps)
                .where(train_steps.c.step > target, train_steps.c.step < step)
                .values(rolled_back=True)
            ).rowcount
            conn.execute(update(run_state).values(rollback_json=None, version_floor=step))
            self.core.event(
                conn,
                "rollback",
                self.core.coordinator_id,
                f"v{target}",
                state="recorded",
                step=step,
                steps_undone=undone,
                reason=request.reason,
            )
            return self._record(conn, conn.execute(select(train_steps).where(train_steps.c.step == step)).one())

    def version_floor(self) -> int:
        """The oldest version whose rollouts may still be trained: the newest rollback's (0: none). Leases, submissions
        and steps all keep to it (:func:`coordinator.ledger.scheduling.oldest_allowed_version`)."""
        with self.db.read() as conn:
            return int(self.core.run_row(conn).version_floor)

    def set_aside(self, step: int) -> list[AcceptedGroup]:
        """The submissions step ``step`` set aside for carrying no signal."""
        with self.db.read() as conn:
            rows = conn.execute(
                _group_columns()
                .join(no_signal_groups, no_signal_groups.c.submission_id == submissions.c.submission_id)
                .where(no_signal_groups.c.step == step)
            ).all()
        return [_group_of(r) for r in rows]

    def groups(self, step: int, with_checked: bool = False) -> list[AcceptedGroup]:
        """The recorded batch of ``step``, in its recorded order, rebuilt from the ledger; ``with_checked``: each
        with the rollout positions validators recomputed (:func:`checked_positions`)."""
        with self.db.read() as conn:
            rows = conn.execute(
                _group_columns(submissions.c.audit_share, leases.c.sampling_seed)
                .join(step_submissions, step_submissions.c.submission_id == submissions.c.submission_id)
                .join(leases, leases.c.lease_id == submissions.c.lease_id)
                .where(step_submissions.c.step == step)
                .order_by(step_submissions.c.position)
            ).all()
            passed = reaudits.passed_positions(conn, [r.submission_id for r in rows]) if with_checked else {}
        groups = [replace(_group_of(r), seed=int(r.sampling_seed)) for r in rows]
        if not with_checked:
            return groups
        return [
            replace(group, checked=self.checked_positions(group, row.audit_share, passed.get(row.submission_id, set())))
            for group, row in zip(groups, rows, strict=True)
        ]

    def checked_positions(self, group: AcceptedGroup, audit_share: float | None, reaudited: set[int]) -> frozenset[int]:
        """The rollout positions of an accepted submission that a validator recomputed: those its audit picked (the
        share fixed when it was stored, or the run's fixed share) and those a passed re-audit did."""
        share = self.core.config.validation.audit_fraction if audit_share is None else audit_share
        count = len(group.submission.rollouts)
        return frozenset(audit_sample_indices(self.core.secret, group.submission_id, count, share)) | reaudited

    def batch(
        self,
        record: StepRecord,
        rules: BatchRules,
        turn_prompts: TurnPrompts,
        with_samples: bool,
        images: PromptImages = text_images,
    ) -> tuple[dict[str, float], list[TrainSample] | None]:
        """A recorded step's batch figures and, ``with_samples``, its samples: the step's groups rebuilt from the
        ledger, each rollout's reward and group advantage, and its samples as ``rules`` keep them
        (:mod:`coordinator.ledger.batches`).

        The one place a batch is assembled; the figures alone when the trainer already has the batch."""
        groups = self.groups(record.step, with_checked=rules.checked_only)
        summary = batch_summary(groups, trained_version=record.step - 1, set_aside=self.set_aside(record.step))
        if not with_samples:
            return summary, None
        samples = train_samples(groups, rules, turn_prompts, images)
        summary["sampled_fraction"] = sampled_fraction(samples)
        summary["num_trained_samples"] = float(len(samples))
        return summary, samples

    def _advance(self, step: int, state: str, metrics: dict[str, Any] | None = None) -> None:
        column = {"trained": "trained_at", "published": "published_at"}[state]
        values: dict[str, Any] = {"state": state, column: self.core.clock()}
        if metrics is not None:
            values["metrics_json"] = json.dumps(metrics, sort_keys=True)
        with self.core.write(None) as conn:
            conn.execute(update(train_steps).where(train_steps.c.step == step).values(**values))
            self.core.event(conn, "train_step", self.core.coordinator_id, str(step), state=state, metrics=metrics or {})

    def mark_trained(self, step: int, metrics: dict[str, Any]) -> None:
        self._advance(step, "trained", metrics)

    def mark_published(self, step: int) -> None:
        self._advance(step, "published")

    def record_eval(self, step: int, values: dict[str, float]) -> None:
        """The eval of policy v``step``: merged into step ``step``'s metrics (v0, the start policy, has no step
        row) and logged as a ``train_step`` event in state ``evaluated``, in one transaction."""
        with self.core.write(None) as conn:
            row = conn.execute(select(train_steps.c.metrics_json).where(train_steps.c.step == step)).first()
            if row is not None:
                merged = {**(json.loads(row.metrics_json) if row.metrics_json else {}), **values}
                conn.execute(
                    update(train_steps)
                    .where(train_steps.c.step == step)
                    .values(metrics_json=json.dumps(merged, sort_keys=True))
                )
            self.core.event(conn, "train_step", self.core.coordinator_id, str(step), state="evaluated", metrics=values)

    def num_published(self) -> int:
        with self.db.read() as conn:
            found = conn.execute(
                select(train_steps.c.step).where(train_steps.c.state == "published").order_by(train_steps.c.step.desc())
            ).first()
        return 0 if found is None else int(found[0])

    def trained_progress(self) -> tuple[int, dict[str, Any]]:
        """How many steps are trained (or published), and the newest one's metrics: two queries, whatever
        the run's length (progress lines come every few seconds for the whole run)."""
        done = train_steps.c.state != "recorded"
        with self.db.read() as conn:
            count = conn.execute(select(func.count()).select_from(train_steps).where(done)).scalar_one()
            newest = conn.execute(
                select(train_steps.c.metrics_json).where(done).order_by(train_steps.c.step.desc()).limit(1)
            ).first()
        metrics = json.loads(newest[0]) if newest is not None and newest[0] else {}
        return int(count), metrics


def _group_columns(*extra: Any) -> Select[Any]:
    """The columns an accepted group is rebuilt from (:func:`_group_of`), then ``extra``, its task joined."""
    columns = (submissions.c.submission_id, submissions.c.policy_version, submissions.c.body_json)
    return select(*columns, submissions.c.verdict_json, tasks.c.prompts_json, *extra).join(
        tasks, tasks.c.task_id == submissions.c.task_id
    )


def _group_of(row: Row[Any]) -> AcceptedGroup:
    return accepted_group(row.submission_id, row.policy_version, row.prompts_json, row.body_json, row.verdict_json)
