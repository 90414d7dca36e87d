"""A training step's metrics: what the trainer measured and the batch's figures, as stored and read back.

The orchestrator records each trained step's metrics with :func:`step_metrics`: the trainer's figures
(:data:`TRAINER_FIGURES` among them) as they come, and the batch's figures
(:func:`coordinator.ledger.batches.batch_summary`) under :data:`BATCH_PREFIX`. An eval of the step's
policy is merged in later (``eval_*``). The views, the dashboard and the exports read them back with
:func:`step_figure`, :func:`named_rewards` and :func:`trainer_figures`, defensively: a stored value that is
not a finite number counts as absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

BATCH_PREFIX = "batch_"
"""What a step's metrics put before each of the batch's figures."""


def step_metrics(trainer_metrics: Mapping[str, Any], batch_figures: Mapping[str, float]) -> dict[str, Any]:
    """A trained step's metrics: the trainer's, and the batch's figures under :data:`BATCH_PREFIX`."""
    return {**trainer_metrics, **{f"{BATCH_PREFIX}{key}": value for key, value in batch_figures.items()}}


NAMED_REWARD_PREFIX = "reward_mean/"
"""Step metrics ``reward_mean/<name>``: the batch mean of each named reward of the environment."""


STEP_NAMED_REWARD_PREFIX = BATCH_PREFIX + NAMED_REWARD_PREFIX
"""The same means as a step's metrics carry them (:func:`step_metrics`)."""


def named_rewards(step_metrics: object) -> dict[str, float]:
    """Reward name -> batch mean, from a step's metrics (read defensively: junk counts as absent)."""
    if not isinstance(step_metrics, dict):
        return {}
    found = {}
    for key, value in step_metrics.items():
        name = str(key).removeprefix(STEP_NAMED_REWARD_PREFIX)
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if str(key).startswith(STEP_NAMED_REWARD_PREFIX) and number and 0 < len(name) <= 64:
            found[name] = float(value)
    return dict(sorted(found.items())[:16])


EVAL_ACCURACY = "eval_accuracy"
"""The key that marks a step's metrics as holding the eval of its policy (``eval_*``, merged in after it)."""


def step_figure(step_metrics: object, key: str) -> float | None:
    """One number of a step's metrics, read defensively (junk and non-finite values count as absent)."""
    if not isinstance(step_metrics, dict):
        return None
    value = step_metrics.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


TRAINER_FIGURES = ("loss", "entropy", "mismatch_kl", "grad_norm", "out_of_band_fraction", "breaker_trips")
"""What the trainer measures on a step's batch, among the step's metrics (the dashboard and /metrics show them)."""


def trainer_figures(step_metrics: object) -> dict[str, float | None]:
    """Each of :data:`TRAINER_FIGURES` of a step's metrics, read as :func:`step_figure` reads one."""
    return {key: step_figure(step_metrics, key) for key in TRAINER_FIGURES}
