"""The RL loop's progress for the dashboard, folded from the ledger's ``train_step`` events.

The orchestrator (:class:`coordinator.ledger.train_steps.TrainSteps`) logs one ``train_step`` event per
state change of a step, with the step number as subject: ``recorded`` (its batch chosen),
``trained`` (with the step's metrics, among them ``batch_reward_mean``, the mean validator
reward over the batch's rollouts, and the trainer's own ``reward_mean``) and ``published``.
An eval during training (:mod:`coordinator.loop.evals`) adds an ``evaluated`` event with its figures
(step 0: the start policy). :class:`TrainingHistory` keeps the newest step in progress, the newest
step published, the reward of each trained step with how its rollouts ended, and each eval; like
:mod:`coordinator.serving.dashboard.history` it is pure logic and reads payloads defensively (a
field of an unexpected type counts as absent).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

from coordinator.ledger.step_metrics import named_rewards, step_figure, trainer_figures
from protocol.schemas import DashboardEval, DashboardTraining, DashboardTrainStep, Event

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


def _kind(metrics: object) -> Literal["train", "skip", "restore"]:
    found = metrics.get("step_kind") if isinstance(metrics, dict) else None
    return "skip" if found == "skip" else "restore" if found == "restore" else "train"


class TrainingHistory:
    """Folds ``train_step`` events (in log order) into the dashboard's training summary."""

    def __init__(self) -> None:
        self.newest_recorded = 0
        self.newest_published = 0
        self.steps: deque[DashboardTrainStep] = deque(maxlen=MAX_STEP_POINTS)
        self.evals: deque[DashboardEval] = deque(maxlen=MAX_STEP_POINTS)
        self.seen = False

    def fold(self, event: Event) -> None:
        subject = event.subject or ""
        if not (subject.isascii() and subject.isdigit() and 0 < len(subject) <= 18):
            return
        step = int(subject)
        state = event.data.get("state")
        if state == "evaluated":
            self._fold_eval(step, event)
            return
        if step < 1:
            return
        self.seen = True
        if state == "recorded":
            self.newest_recorded = max(self.newest_recorded, step)
        elif state == "trained":
            self.newest_recorded = max(self.newest_recorded, step)
            reward = _reward(event.data.get("metrics"))
            if reward is not None and all(s.step != step for s in self.steps):
                metrics = event.data.get("metrics")
                self.steps.append(
                    DashboardTrainStep(
                        step=step,
                        at=event.at,
                        reward_mean=reward,
                        rewards=named_rewards(metrics),
                        completion_tokens_mean=step_figure(metrics, "batch_completion_tokens_mean"),
                        stop_fraction=step_figure(metrics, "batch_stop_fraction"),
                        truncated_fraction=step_figure(metrics, "batch_truncated_fraction"),
                        zero_signal_fraction=step_figure(metrics, "batch_zero_signal_fraction"),
                        kind=_kind(metrics),
                        **trainer_figures(metrics),
                    )
                )
        elif state == "published":
            self.newest_published = max(self.newest_published, step)

    def _fold_eval(self, step: int, event: Event) -> None:
        metrics = event.data.get("metrics")
        accuracy = step_figure(metrics, "eval_accuracy")
        reward = step_figure(metrics, "eval_reward_mean")
        if accuracy is None or reward is None or any(e.step == step for e in self.evals):
            return
        self.seen = True
        self.evals.append(
            DashboardEval(
                step=step,
                at=event.at,
                accuracy=accuracy,
                reward_mean=reward,
                stop_fraction=step_figure(metrics, "eval_stop_fraction"),
                completion_tokens_mean=step_figure(metrics, "eval_completion_tokens_mean"),
            )
        )

    def summary(self) -> DashboardTraining | None:
        """None until a step has been recorded."""
        if not self.seen:
            return None
        in_progress = self.newest_recorded if self.newest_recorded > self.newest_published else None
        return DashboardTraining(
            current_step=in_progress,
            num_steps_done=self.newest_published,
            steps=sorted(self.steps, key=lambda s: s.step),
            evals=sorted(self.evals, key=lambda e: e.step),
        )
