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


def build_scheduler(
    optimizer: torch.optim.Optimizer, num_steps: int, config: OptimizerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, num_steps, config))
