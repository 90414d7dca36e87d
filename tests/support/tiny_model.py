"""Tiny random-init Qwen2 checkpoints for engine tests, TOPLOC calibration and benchmarks.

Nothing is downloaded: the model is built from a ``transformers.Qwen2Config`` with a fixed
seed and saved as HF safetensors in a local directory, the layout the engines load. Two knobs
make a random model behave more like a trained one where the checks need it: ``logit_scale``
multiplies the output head (a trained model's next-token distribution is peaked, while a
random init at the default scale is nearly uniform and lets the sampling noise decide every
token), and ``eos_bias`` raises the EOS token's logit so completions end at varied lengths.
This is not the built-in demo model (trainer/ owns that), though both are made by
:func:`engines.random_qwen2.random_qwen2`; any Qwen2-style checkpoint works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engines.random_qwen2 import random_qwen2

TINY_EOS_TOKEN_ID = 1


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    logit_scale: float = 8.0
    """Multiplies lm_head after init: logits then have a standard deviation of ~1.3 nats, not ~0.16."""
    eos_bias: float = 1.5
    """Raises the EOS logit by about 1.7x this on average (a few % per step at 1.5); 0 disables."""


def save_tiny_qwen2(path: Path, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Build a random Qwen2 causal LM with ``seed`` and save it (safetensors + config) under ``path``."""
    from transformers import Qwen2Config

    spec = spec or TinyModelSpec()
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=TINY_EOS_TOKEN_ID,
        pad_token_id=0,
    )
    model = random_qwen2(config, seed)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(spec.logit_scale)
        if spec.eos_bias:
            # Qwen2 has no output bias. Give every embedding a common offset in dimension 0, which
            # survives the layers as a mostly positive final-norm feature (mean ~1.7 at this init),
            # and let the EOS row read it: EOS then ends completions at varied lengths.
            model.get_input_embeddings().weight[:, 0] += 0.1
            head[TINY_EOS_TOKEN_ID, 0] += spec.eos_bias
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def perturb_checkpoint(source: Path, target: Path, relative_noise: float, seed: int = 0) -> Path:
    """Copy a checkpoint with every weight multiplied by (1 + relative_noise * N(0, 1)) elementwise."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.mul_(1.0 + relative_noise * noise)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    return target


def quantize_checkpoint(source: Path, target: Path, bits: int = 8) -> Path:
    """Copy a checkpoint with every matrix fake-quantized to ``bits``-bit integers per output row (weight-only).

    What a worker serving a cheaper int8 build of the policy computes with: each row scaled so its
    largest magnitude is the largest integer, rounded, and scaled back (vectors such as norms stay)."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    levels = (1 << (bits - 1)) - 1
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                scale = parameter.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / levels
                parameter.copy_((parameter / scale).round() * scale)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    return target
