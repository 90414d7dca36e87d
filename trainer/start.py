"""The RL starting checkpoint of the demo: an *early* SFT checkpoint of the built-in model.

SFT alone solves reverse_text given enough steps, which would leave RL nothing to show; the
start point is therefore stopped early, where the sampled reward (T = 1) on the eval set is
about 0.5. ``builtin:tiny-qwen2-reverse-start`` resolves to it: built on first use by
:func:`build_start_checkpoint` (SFT with the settings below, in one process, about a minute
or two on a CPU) and cached next to the built-in model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainer.config import OptimizerConfig, SftConfig

log = logging.getLogger("trainer.start")

START_SFT_STEPS = 200
START_SFT_LR = 1e-3
START_BATCH_SIZE = 32


def start_sft_config(output_dir: Path, base_model: str = "builtin:tiny-qwen2") -> SftConfig:
    """The SFT config that produces the start checkpoint (reverse_text, early stop)."""
    return SftConfig(
        model=base_model,
        output_dir=output_dir,
        num_steps=START_SFT_STEPS,
        batch_size=START_BATCH_SIZE,
        seed=0,
        optimizer=OptimizerConfig(lr=START_SFT_LR),
        resume=False,
        eval_examples=0,
    )


def build_start_checkpoint(output_dir: Path, base_model: str = "builtin:tiny-qwen2") -> Path:
    """Run the early SFT into ``output_dir`` (run files under ``output_dir/run``); returns the policy dir."""
    from trainer.metrics import MetricsLogger
    from trainer.sft import train_sft
    from trainer.train import Trainer

    config = start_sft_config(output_dir / "run", base_model)
    trainer = Trainer(config.trainer_section(), config.num_steps)
    if trainer.info.world_size != 1:
        raise ValueError("build the start checkpoint in one process")
    log.info("building the RL start checkpoint: %d SFT steps of reverse_text", config.num_steps)
    with MetricsLogger(config.output_dir / "metrics.jsonl", console_every=20) as metrics:
        last = train_sft(trainer, config, metrics)
    log.info("start checkpoint: SFT loss %.3f after %d steps", last.get("loss", float("nan")), trainer.step)
    return trainer.export(output_dir)
