"""What the trainer trusts and refuses in a run, from its config: the signed run spec's training policy.

:func:`behaviour_source` resolves ``orchestrator.loss.behaviour_logprobs``: ``auto`` is ``recompute``, the trainer's
own numbers, whatever share validators recompute: a sample no trainer recomputed never puts a worker's number into
the loss, and a validator that colludes cannot pass one either. ``sampler`` is the operator's explicit choice.
:func:`training_policy` is the whole policy as the run spec signs it (:class:`protocol.schemas.TrainingPolicy`).
"""

from __future__ import annotations

from typing import Literal

from coordinator.config import CoordinatorConfig, ValidationConfig
from protocol.schemas import TrainingPolicy


def every_sample_audited(validation: ValidationConfig) -> bool:
    """Whether validators recompute every sample of every submission (full audit)."""
    return validation.audit_fraction >= 1.0 and not validation.adaptive.enabled


def behaviour_source(config: CoordinatorConfig) -> Literal["recompute", "sampler"]:
    """Where the run's behaviour log-probabilities come from (``auto`` resolved)."""
    chosen = config.orchestrator.loss.behaviour_logprobs
    return "recompute" if chosen == "auto" else chosen


def training_policy(config: CoordinatorConfig) -> TrainingPolicy:
    """The run's training policy, as the run spec signs it."""
    orchestrator = config.orchestrator
    return TrainingPolicy(
        behaviour_logprobs=behaviour_source(config),
        breakers=orchestrator.breakers.enabled,
        no_signal_filter=orchestrator.no_signal_filter,
        rollback=orchestrator.canary.enabled and orchestrator.eval_every_steps > 0,
    )
