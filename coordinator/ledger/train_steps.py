"""The orchestrator's record in the ledger: which accepted submissions make up which training step.

A step goes ``recorded -> trained -> published``. :meth:`TrainSteps.record_batch` picks the
step's submissions and records them in the same transaction that creates the step, before
any training: ``step_submissions`` is keyed by submission id, so an accepted rollout is used
in at most one step, and a restarted coordinator finds the recorded batch and trains it
again instead of choosing a new one. Candidates are accepted submissions not used before,
made with a policy version no older than the step allows (the async level), oldest
accepted first, whose verdict carries a reward for every rollout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, func, insert, select, update

from coordinator.ledger.batches import (
    AcceptedGroup,
    PromptImages,
    TurnPrompts,
    accepted_group,
    batch_summary,
    sampled_fraction,
    text_images,
    train_samples,
    verdict_rewards,
)
from coordinator.ledger.core import LedgerCore
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import (
    accepted_groups,
    events,
    step_submissions,
    submissions,
    tasks,
    train_steps,
)
from trainer.transport import TrainSample

CANDIDATE_SCAN_FACTOR = 4

PUBLISHED_STEPS = select(func.count()).where(train_steps.c.state == "published")
"""How many training steps the RL loop has published (the status's count, and the run's end)."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    state: str
    min_policy_version: int
    submission_ids: list[str]
    metrics: dict[str, Any]


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
        )

    def steps(self) -> list[StepRecord]:
        with self.db.read() as conn:
            rows = conn.execute(select(train_steps).order_by(train_steps.c.step)).all()
            return [self._record(conn, row) for row in rows]

    def step(self, step: int) -> StepRecord | None:
        with self.db.read() as conn:
            row = conn.execute(select(train_steps).where(train_steps.c.step == step)).first()
            return None if row is None else self._record(conn, row)

    def record_batch(self, step: int, groups_per_step: int, min_version: int) -> StepRecord | None:
        """Record step ``step``'s batch (or return the one already recorded); None while too few groups."""
        with self.core.write(None) as conn:
            self.core.run_row(conn, lock=True)  # one recorder at a time, also across API replicas
            existing = conn.execute(select(train_steps).where(train_steps.c.step == step)).first()
            if existing is not None:
                return self._record(conn, existing)
            used = select(step_submissions.c.submission_id)
            candidates = conn.execute(
                select(submissions.c.submission_id, submissions.c.body_json, submissions.c.verdict_json)
                .join(accepted_groups, accepted_groups.c.submission_id == submissions.c.submission_id)
                .where(
                    submissions.c.status == "accepted",
                    submissions.c.policy_version >= min_version,
                    submissions.c.submission_id.not_in(used),
                )
                .order_by(accepted_groups.c.accepted_at, submissions.c.submission_id)
                .limit(groups_per_step * CANDIDATE_SCAN_FACTOR)
            ).all()
            chosen = [
                row.submission_id
                for row in candidates
                if verdict_rewards(row.verdict_json, len(json.loads(row.body_json)["rollouts"])) is not None
            ][:groups_per_step]
            if len(chosen) < groups_per_step:
                return None
            now = self.core.clock()
            conn.execute(
                insert(train_steps).values(step=step, state="recorded", min_policy_version=min_version, recorded_at=now)
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

    def groups(self, step: int) -> list[AcceptedGroup]:
        """The recorded batch of ``step``, in its recorded order, rebuilt from the ledger."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(
                    submissions.c.submission_id,
                    submissions.c.policy_version,
                    submissions.c.body_json,
                    submissions.c.verdict_json,
                    tasks.c.prompts_json,
                )
                .join(step_submissions, step_submissions.c.submission_id == submissions.c.submission_id)
                .join(tasks, tasks.c.task_id == submissions.c.task_id)
                .where(step_submissions.c.step == step)
                .order_by(step_submissions.c.position)
            ).all()
        return [
            accepted_group(r.submission_id, r.policy_version, r.prompts_json, r.body_json, r.verdict_json) for r in rows
        ]

    def batch(
        self,
        record: StepRecord,
        normalize_std: bool,
        turn_prompts: TurnPrompts,
        with_samples: bool,
        images: PromptImages = text_images,
    ) -> tuple[dict[str, float], list[TrainSample] | None]:
        """A recorded step's batch figures and, ``with_samples``, its samples: the step's groups rebuilt from the
        ledger, each rollout's reward and group advantage, and its samples (:mod:`coordinator.ledger.batches`).

        The one place a batch is assembled; the figures alone when the trainer already has the batch."""
        groups = self.groups(record.step)
        summary = batch_summary(groups, trained_version=record.step - 1)
        if not with_samples:
            return summary, None
        samples = train_samples(groups, normalize_std, turn_prompts, images)
        summary["sampled_fraction"] = sampled_fraction(samples)
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
