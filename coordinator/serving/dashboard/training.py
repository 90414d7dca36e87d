"""The RL loop's progress for the dashboard, folded from the ledger's ``train_step`` events.

The orchestrator (:class:`coordinator.loop.train_steps.TrainSteps`) logs one ``train_step`` event per
state change of a step, with the step number as subject: ``recorded`` (its batch chosen),
``trained`` (with the step's metrics, among them ``batch_reward_mean``, the mean validator
reward over the batch's rollouts, and the trainer's own ``reward_mean``) and ``published``.
:class:`TrainingHistory` keeps the newest step in progress, the newest step published and the
reward of each trained step; like :mod:`coordinator.serving.dashboard.history` it is pure logic and
reads payloads defensively (a field of an unexpected type counts as absent).
"""

from __future__ import annotations

import math
from collections import deque

from coordinator.ledger.batches import named_rewards
from protocol.schemas import DashboardTraining, DashboardTrainStep, Event

MAX_STEP_POINTS = 500
REWARD_KEYS = ("batch_reward_mean", "reward_mean")


def _reward(metrics: object) -> float | None:
    if not isinstance(metrics, dict):
        return None
    for key in REWARD_KEYS:
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


class TrainingHistory:
    """Folds ``train_step`` events (in log order) into the dashboard's training summary."""

    def __init__(self) -> None:
        self.newest_recorded = 0
        self.newest_published = 0
        self.steps: deque[DashboardTrainStep] = deque(maxlen=MAX_STEP_POINTS)
        self.seen = False

    def fold(self, event: Event) -> None:
        subject = event.subject or ""
        if not (subject.isascii() and subject.isdigit() and 0 < len(subject) <= 18) or int(subject) < 1:
            return
        step = int(subject)
        state = event.data.get("state")
        self.seen = True
        if state == "recorded":
            self.newest_recorded = max(self.newest_recorded, step)
        elif state == "trained":
            self.newest_recorded = max(self.newest_recorded, step)
            reward = _reward(event.data.get("metrics"))
            if reward is not None and all(s.step != step for s in self.steps):
                rewards = named_rewards(event.data.get("metrics"))
                self.steps.append(DashboardTrainStep(step=step, at=event.at, reward_mean=reward, rewards=rewards))
        elif state == "published":
            self.newest_published = max(self.newest_published, step)

    def summary(self) -> DashboardTraining | None:
        """None until a step has been recorded."""
        if not self.seen:
            return None
        in_progress = self.newest_recorded if self.newest_recorded > self.newest_published else None
        return DashboardTraining(
            current_step=in_progress,
            num_steps_done=self.newest_published,
            steps=sorted(self.steps, key=lambda s: s.step),
        )
