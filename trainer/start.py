"""The RL start checkpoints: early SFT checkpoints of the built-in models, with room left to learn.

SFT alone solves the built-in tasks given enough steps, which would leave RL nothing to show; a
start point is therefore stopped early. ``builtin:tiny-qwen2-reverse-start`` is tiny-qwen2 after
200 steps of reverse_text (sampled reward about 0.5, no exact reversal);
``builtin:small-qwen3-arithmetic-start``, ``builtin:small-qwen3-sort-start`` and
``builtin:small-qwen3-calculator-start`` are small-qwen3 after a short SFT on arithmetic, on sort_digits and
on calculator episodes, right on a minority of held-out problems and stopping with EOS;
``builtin:tiny-qwen2-vl-count-start`` is tiny-qwen2-vl after a short SFT on count_shapes, its vision tower
kept. Each is built on first use by :func:`build_start_checkpoint` with its :class:`StartRecipe` (one process,
minutes on a CPU) and cached next to the built-in models.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trainer.config import OptimizerConfig, SftConfig
from trainer.metrics import MetricsLogger

log = logging.getLogger("trainer.start")


@dataclass(frozen=True)
class StartRecipe:
    """How a start checkpoint is made from its base model: which task, how many SFT steps, how fast."""

    environment: str
    """The built-in environment whose reference answers are the SFT data."""
    num_steps: int
    batch_size: int
    lr: float
    warmup_steps: int = 0


REVERSE_RECIPE = StartRecipe(environment="reverse_text", num_steps=200, batch_size=32, lr=1e-3)
ARITHMETIC_RECIPE = StartRecipe(environment="arithmetic", num_steps=1000, batch_size=64, lr=2e-3)
SORT_RECIPE = StartRecipe(environment="sort_digits", num_steps=120, batch_size=64, lr=2e-3)
"""Stopped in the middle of the task's SFT learning curve: at 120 steps about 0.43 of held-out samples (T = 1) are
exact and 0.8 of prompts have an exact one among 8 samples; at 200 steps SFT alone is at 0.89."""
CALCULATOR_RECIPE = StartRecipe(environment="calculator", num_steps=120, batch_size=64, lr=2e-3)
"""SFT on the calculator's model episodes (ask the tool, answer with what it said), stopped as it starts to work:
held-out exact answers (T = 1, 128 problems x 2) were 0.05 at 100 steps, 0.22 at 120, 0.33 at 140."""


COUNT_RECIPE = StartRecipe(environment="count_shapes", num_steps=60, batch_size=64, lr=1e-3)
"""SFT of the text model on count_shapes, the random vision tower frozen (as RL keeps it), stopped early: held-out
exact counts (T = 1, 256 images x 4) were 0.17 at 40 steps, 0.22 at 60, 0.31 at 100, 0.39 at 130 (chance: 1/6).
Training the tower too at lr 1e-3 or above left every count at chance for 1,500 steps."""


def start_sft_config(
    output_dir: Path, base_model: str = "builtin:tiny-qwen2", recipe: StartRecipe = REVERSE_RECIPE
) -> SftConfig:
    """The SFT config that produces a start checkpoint (``recipe``'s task, early stop)."""
    return SftConfig(
        model=base_model,
        environment={"type": "builtin", "name": recipe.environment},
        output_dir=output_dir,
        num_steps=recipe.num_steps,
        batch_size=recipe.batch_size,
        seed=0,
        optimizer=OptimizerConfig(lr=recipe.lr, warmup_steps=recipe.warmup_steps),
        resume=False,
        eval_examples=0,
    )


def build_start_checkpoint(
    output_dir: Path, base_model: str = "builtin:tiny-qwen2", recipe: StartRecipe = REVERSE_RECIPE
) -> Path:
    """Run the early SFT into ``output_dir`` (run files under ``output_dir/run``); returns the policy dir."""
    from trainer.sft import train_sft
    from trainer.train import Trainer

    config = start_sft_config(output_dir / "run", base_model, recipe)
    trainer = Trainer(config.trainer_section(), config.num_steps)
    if trainer.info.world_size != 1:
        raise ValueError("build the start checkpoint in one process")
    log.info("building an RL start checkpoint: %d SFT steps of %s", config.num_steps, recipe.environment)
    with MetricsLogger(config.output_dir / "metrics.jsonl", console_every=20) as metrics:
        last = train_sft(trainer, config, metrics)
    log.info("start checkpoint: SFT loss %.3f after %d steps", last.get("loss", float("nan")), trainer.step)
    return trainer.export(output_dir)
