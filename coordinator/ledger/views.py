"""Read-only views of the ledger: run status, node reputation, the event log, policy manifests.

The public, unsigned routes, the gossip node and the dashboard read through these (the
:class:`coordinator.ledger.ledger.Ledger` facade passes them on). Each view is one read transaction
(a consistent snapshot).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row, func, select

from coordinator.ledger.core import LedgerCore
from coordinator.ledger.reputation import ValidatorRecordPolicy, validator_flagged
from coordinator.ledger.step_metrics import EVAL_ACCURACY, named_rewards, step_figure, trainer_figures
from coordinator.ledger.storage.tables import events, nodes, policy_versions, run_state, submissions, tasks, train_steps
from coordinator.ledger.train_steps import PUBLISHED_STEPS
from protocol.errors import NotFoundError
from protocol.schemas import Event, EventPage, NodeStats, RunStats, RunStatus, SignedManifest

EVAL_SCAN_STEPS = 1000
"""How many of the newest steps are searched for the newest eval (each status read; evals come every few steps)."""
_NEWEST_STEPS = (
    select(train_steps.c.step, train_steps.c.metrics_json)
    .order_by(train_steps.c.step.desc())
    .limit(EVAL_SCAN_STEPS)
    .subquery()
)
_NEWEST_EVAL = (  # evals are merged into their step's metrics: a LIKE over a bounded number of rows
    select(_NEWEST_STEPS.c.step, _NEWEST_STEPS.c.metrics_json)
    .where(_NEWEST_STEPS.c.metrics_json.like(f'%"{EVAL_ACCURACY}"%'))
    .order_by(_NEWEST_STEPS.c.step.desc())
    .limit(1)
)


def _no_constant(_name: str) -> None:
    """NaN and infinities in an event stored by an older ledger read as null (JSON has no such numbers)."""
    return None


RECENT_STEPS = 10
"""How many of the newest steps the status's step time is the mean of."""


class LedgerViews:
    """The read-only part of the ledger, over its :class:`~coordinator.ledger.core.LedgerCore`."""

    def __init__(self, core: LedgerCore) -> None:
        self.db = core.db
        self.scheduling = core.scheduling
        self.clock = core.clock
        validation = core.config.validation
        self.validator_record = ValidatorRecordPolicy(validation.flag_after_outvoted, validation.max_outvoted_fraction)
        """When a validator's votes against the decisions flag it (see :mod:`coordinator.ledger.reputation`)."""

    @property
    def _live_s(self) -> float:
        return self.scheduling.worker_live_s

    def manifest(self, version: int | None) -> SignedManifest:
        with self.db.read() as conn:
            query = select(policy_versions)
            query = (
                query.order_by(policy_versions.c.version.desc())
                if version is None
                else query.where(policy_versions.c.version == version)
            )
            row = conn.execute(query.limit(1)).first()
        if row is None:
            raise NotFoundError(f"policy version {'(any)' if version is None else version} has not been published")
        return SignedManifest.model_validate(
            {"manifest": json.loads(row.manifest_json), "signer": row.signer, "signature_b64": row.signature}
        )

    # ---- read-only views -----------------------------------------------------------------------

    def newest_eval(self) -> tuple[int, dict[str, Any]] | None:
        """The newest trained step (of the last EVAL_SCAN_STEPS) whose policy was evaluated, and its metrics."""
        with self.db.read() as conn:
            row = conn.execute(_NEWEST_EVAL).first()
        return None if row is None else (int(row.step), json.loads(row.metrics_json))

    def status(self) -> RunStatus:
        now = self.clock()
        with self.db.read() as conn:
            run = LedgerCore.run_row(conn)
            live: dict[str, int] = dict(
                conn.execute(
                    select(nodes.c.role, func.count())
                    .where(nodes.c.last_seen >= now - self._live_s, nodes.c.banned.is_(False))
                    .group_by(nodes.c.role)
                ).all()
            )
            task_counts: dict[str, int] = dict(
                conn.execute(select(tasks.c.state, func.count()).group_by(tasks.c.state)).all()
            )
            sub_counts: dict[str, int] = dict(
                conn.execute(select(submissions.c.status, func.count()).group_by(submissions.c.status)).all()
            )
            steps_done = conn.execute(PUBLISHED_STEPS).scalar_one()
            published_at = conn.execute(
                select(train_steps.c.published_at)
                .where(train_steps.c.state == "published", train_steps.c.published_at.is_not(None))
                .order_by(train_steps.c.step.desc())
                .limit(RECENT_STEPS + 1)
            ).scalars()
            times = sorted(float(t) for t in published_at)
            newest_metrics = conn.execute(
                select(train_steps.c.metrics_json)
                .where(train_steps.c.metrics_json.is_not(None))
                .order_by(train_steps.c.step.desc())
                .limit(1)
            ).scalar()
            evaluated = conn.execute(_NEWEST_EVAL).first()
            trips = conn.execute(
                select(train_steps.c.trips_json).where(train_steps.c.trips_json.is_not(None))
            ).scalars()
            num_trips = sum(len(json.loads(found)) for found in trips)
            num_rollbacks = conn.execute(
                select(func.count()).select_from(train_steps).where(train_steps.c.kind == "restore")
            ).scalar_one()
        step_metrics = json.loads(newest_metrics) if newest_metrics else {}
        eval_metrics = json.loads(evaluated.metrics_json) if evaluated is not None else {}
        return RunStatus(
            run_name=run.run_name,
            current_policy_version=run.current_policy_version,
            async_level=self.scheduling.async_level,
            num_workers_live=live.get("worker", 0),
            num_validators_live=live.get("validator", 0),
            num_tasks_open=task_counts.get("open", 0) + task_counts.get("leased", 0),
            num_submissions_pending=sub_counts.get("pending", 0),
            num_submissions_accepted=sub_counts.get("accepted", 0),
            num_submissions_rejected=sub_counts.get("rejected", 0),
            num_train_steps_done=steps_done,
            step_s=(times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
            step_rewards=named_rewards(step_metrics),
            step_completion_tokens_mean=step_figure(step_metrics, "batch_completion_tokens_mean"),
            step_stop_fraction=step_figure(step_metrics, "batch_stop_fraction"),
            step_truncated_fraction=step_figure(step_metrics, "batch_truncated_fraction"),
            step_zero_signal_fraction=step_figure(step_metrics, "batch_zero_signal_fraction"),
            **{f"step_{key}": value for key, value in trainer_figures(step_metrics).items()},
            num_breaker_trips=num_trips,
            num_rollbacks=int(num_rollbacks),
            eval_step=None if evaluated is None else int(evaluated.step),
            eval_accuracy=step_figure(eval_metrics, "eval_accuracy"),
            eval_reward_mean=step_figure(eval_metrics, "eval_reward_mean"),
            eval_stop_fraction=step_figure(eval_metrics, "eval_stop_fraction"),
            eval_completion_tokens_mean=step_figure(eval_metrics, "eval_completion_tokens_mean"),
            num_submissions_environment_error=sub_counts.get("environment_error", 0),
            num_submissions_expired=sub_counts.get("expired", 0),
        )

    def live_node_ids(self) -> set[str]:
        """The workers and validators seen within ``scheduling.worker_live_s`` and not banned."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(nodes.c.node_id).where(
                    nodes.c.last_seen >= self.clock() - self._live_s,
                    nodes.c.banned.is_(False),
                    nodes.c.role.in_(("worker", "validator")),
                )
            ).all()
        return {row.node_id for row in rows}

    def flagged(self, node: Row[Any]) -> bool:
        """Whether a node's row shows a validator that keeps voting against the decisions."""
        return node.role == "validator" and validator_flagged(
            self.validator_record, node.num_votes_agreed, node.num_votes_outvoted
        )

    def recent_nodes(self, limit: int) -> list[Row[Any]]:
        """The ``limit`` nodes seen most recently, newest first: every column of their rows."""
        with self.db.read() as conn:
            return list(conn.execute(select(nodes).order_by(nodes.c.last_seen.desc()).limit(limit)).all())

    def live_tokens_per_s(self) -> float:
        """The generation rate the live workers (seen within ``scheduling.worker_live_s``) last reported, summed."""
        with self.db.read() as conn:
            total = conn.execute(
                select(func.coalesce(func.sum(nodes.c.tokens_per_s), 0.0)).where(
                    nodes.c.role == "worker", nodes.c.last_seen >= self.clock() - self._live_s
                )
            ).scalar_one()
        return float(total)

    def latest_published(self) -> tuple[int, float] | None:
        """(version, published_at) of the newest policy version; None before the first."""
        with self.db.read() as conn:
            newest = conn.execute(select(func.max(policy_versions.c.version))).scalar()
            if newest is None:
                return None
            published_at = conn.execute(
                select(policy_versions.c.published_at).where(policy_versions.c.version == newest)
            ).scalar_one()
        return int(newest), float(published_at)

    def waiting_tasks(self) -> tuple[int, int]:
        """(tasks open for leasing, current policy version): tasks are made on demand, so open ones were re-queued."""
        with self.db.read() as conn:
            num_open = conn.execute(select(func.count()).where(tasks.c.state == "open")).scalar_one()
            version = conn.execute(select(run_state.c.current_policy_version)).scalar_one()
        return int(num_open), int(version)

    def stats(self, limit: int) -> RunStats:
        rows = self.recent_nodes(limit)
        fields = [name for name in NodeStats.model_fields if name not in ("v", "flagged")]  # columns of nodes
        node_stats = [
            NodeStats.model_validate({**{name: row._mapping[name] for name in fields}, "flagged": self.flagged(row)})
            for row in rows
        ]
        return RunStats(status=self.status(), nodes=node_stats)

    def events(self, after: int, limit: int) -> EventPage:
        with self.db.read() as conn:
            rows = conn.execute(
                select(events).where(events.c.event_id > after).order_by(events.c.event_id).limit(limit)
            ).all()
        found = [
            Event(
                event_id=row.event_id,
                at=row.at,
                kind=row.kind,
                node_id=row.node_id,
                subject=row.subject,
                data=json.loads(row.data_json, parse_constant=_no_constant),
            )
            for row in rows
        ]
        return EventPage(events=found, next_after=found[-1].event_id if found else after)

    def ping(self) -> None:
        with self.db.read() as conn:
            conn.execute(select(1))
