"""Pre-step breakers: whether a step's update may be applied, from its figures and the run's history.

Pure functions. The trainer computes a step's gradient, then asks :func:`breaker_trips` before
``optimizer.step()``; a step with any trip is not applied. What trips (:class:`~trainer.config.BreakerConfig`):

- a non-finite gradient norm or loss;
- a pre-clip gradient norm above ``grad_norm_ceiling``, or above ``grad_norm_median_factor`` times the median of
  the last ``median_steps`` applied steps' norms, once ``median_min_steps`` were applied;
- more than ``max_out_of_band_fraction`` of the trained tokens with an importance ratio outside ``ratio_band``, and
  a mean k3 KL between the behaviour log-probabilities and the trainer's above ``max_mismatch_kl``: both only where
  the ratio's denominator is the sampling engine's number. Where the trainer recomputed it, both measure how far
  the policy moved since an older version drew a token (which the loss's correction bounds), not whether anyone's
  numbers describe the policy: the claims are compared sample by sample instead, and those far off re-audited;
- a trained token that is not the policy's seeded draw (with ``draw_tolerance`` set, :mod:`trainer.draws`): a sample
  whatever validator accepted it was not drawn by this policy.

Clipping bounds how far one step moves the weights, not in which direction: a batch built to move the policy
somewhere bad shows as a gradient far larger than the run's usual one, or as tokens whose ratios left the band
(their behaviour numbers do not describe the policy), and a step applied with either is what a permissionless
trainer must refuse.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainer.config import BreakerConfig


@dataclass(frozen=True)
class StepFigures:
    """What the breakers read of one step, before the update."""

    grad_norm: float
    """The global gradient norm before clipping."""
    loss: float
    out_of_band_fraction: float
    """Share of the trained tokens whose importance ratio is outside the band."""
    mismatch_kl: float
    """Mean k3 KL between the behaviour log-probabilities and the trainer's, per trained token."""
    off_draw_samples: int = 0
    """Samples with a trained token that is not the policy's seeded draw (:mod:`trainer.draws`)."""
    recomputed: bool = False
    """The behaviour log-probabilities are the trainer's own: the band and KL figures trip nothing."""


def grad_norm_median(history: Sequence[float], config: BreakerConfig) -> float | None:
    """The running median the norm rule compares with; None while fewer than ``median_min_steps`` were applied."""
    recent = list(history)[-config.median_steps :]
    if len(recent) < config.median_min_steps:
        return None
    return statistics.median(recent)


def breaker_trips(figures: StepFigures, history: Sequence[float], config: BreakerConfig) -> list[str]:
    """Why the step must not be applied (empty: it may), one short sentence per tripped breaker; ``history``: the
    pre-clip gradient norms of the run's applied steps, oldest first."""
    if not config.enabled:
        return []
    trips: list[str] = []
    if not (math.isfinite(figures.grad_norm) and math.isfinite(figures.loss)):
        trips.append(f"non-finite gradient (norm {figures.grad_norm}, loss {figures.loss})")
        return trips
    if figures.grad_norm > config.grad_norm_ceiling:
        trips.append(f"gradient norm {figures.grad_norm:.4g} above the ceiling {config.grad_norm_ceiling:.4g}")
    median = grad_norm_median(history, config)
    if median is not None and figures.grad_norm > config.grad_norm_median_factor * median:
        trips.append(
            f"gradient norm {figures.grad_norm:.4g} above {config.grad_norm_median_factor:g} x the median "
            f"{median:.4g} of the last {min(len(history), config.median_steps)} steps"
        )
    if not figures.recomputed and figures.out_of_band_fraction > config.max_out_of_band_fraction:
        low, high = config.ratio_band
        trips.append(
            f"{figures.out_of_band_fraction:.1%} of the trained tokens have a ratio outside [{low:g}, {high:g}] "
            f"(at most {config.max_out_of_band_fraction:.1%})"
        )
    if not figures.recomputed and figures.mismatch_kl > config.max_mismatch_kl:
        trips.append(f"mismatch KL {figures.mismatch_kl:.4g} above {config.max_mismatch_kl:g}")
    if figures.off_draw_samples:
        trips.append(f"{figures.off_draw_samples} samples hold tokens that are not the policy's seeded draw")
    return trips
