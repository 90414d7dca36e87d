"""Configs of `prime-trainer sft` and `prime-trainer eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from protocol.config import RoleConfig, Section


class OptimizerConfig(Section):
    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global norm."""
    warmup_steps: int = Field(default=0, ge=0)


class SftConfig(RoleConfig):
    model_config = SettingsConfigDict(env_prefix="PRIME_TRAINER_")

    model: str = "builtin:tiny-qwen2"
    """A local HF checkpoint directory, or `builtin:tiny-qwen2` (made by our code, no download)."""
    task: str = "reverse_text"
    """Built-in task whose prompt/completion pairs are the SFT data."""
    output_dir: Path = Path("runs/sft")
    """Checkpoints and the exported HF policy go here."""
    num_steps: int = Field(default=300, ge=1)
    batch_size: int = Field(default=32, ge=1)
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"
    """float32 on CPUs (bf16 is 20-30x slower there); bfloat16 on GPUs."""
    optimizer: OptimizerConfig = OptimizerConfig()
