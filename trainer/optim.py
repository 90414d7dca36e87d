"""AdamW and the learning-rate schedule (linear warm-up, then constant, cosine or linear decay)."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.config import OptimizerConfig
from trainer.lora import trainable_parameters


def lr_factor(step: int, num_steps: int, config: OptimizerConfig) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based) of ``num_steps``."""
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(1, num_steps - config.warmup_steps - 1)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    floor = config.min_lr_ratio
    if config.schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return floor + (1 - floor) * (1 - progress)


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the parameters that train (all of them, or a LoRA model's adapters)."""
    return torch.optim.AdamW(
        trainable_parameters(model),
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )


RESTORE_WARMUP_STEPS = 5
"""The warm-up after a restore when the run has none of its own (``warmup_steps`` 0)."""


class Schedule:
    """The lr multiplier of a :class:`~torch.optim.lr_scheduler.LambdaLR`: :func:`lr_factor`, times a second linear
    warm-up from ``rewarm_from`` on (set by :meth:`rewarm`). LambdaLR's state dict keeps a callable object's
    ``__dict__``: ``rewarm_from`` lives there, so exact resume holds after a restore, while the run's schedule sits
    in slots and always comes from the config the trainer starts with, never from a checkpoint."""

    __slots__ = ("__dict__", "config", "num_steps", "rewarm_steps")

    def __init__(self, num_steps: int, config: OptimizerConfig) -> None:
        self.num_steps = num_steps
        self.config = config
        self.rewarm_steps = config.warmup_steps or RESTORE_WARMUP_STEPS
        self.rewarm_from = -1

    def __call__(self, step: int) -> float:
        factor = lr_factor(step, self.num_steps, self.config)
        if 0 <= self.rewarm_from <= step < self.rewarm_from + self.rewarm_steps:
            factor *= (step - self.rewarm_from + 1) / self.rewarm_steps
        return factor

    def rewarm(self, step: int) -> None:
        """Warm up again from optimizer step ``step`` (0-based): Adam's moments were reset, and with fresh moments
        its first steps move every parameter by about the learning rate."""
        self.rewarm_from = step


def build_scheduler(
    optimizer: torch.optim.Optimizer, num_steps: int, config: OptimizerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule(num_steps, config))
