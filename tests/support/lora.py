"""Small random PEFT LoRA adapters on a local checkpoint, for tests of the engines' adapter support.

Nothing is downloaded: the base is loaded with ``transformers`` from a local directory (e.g. one of
:func:`tests.support.tiny_model.save_tiny_model`), wrapped with :func:`peft.get_peft_model` on every
linear layer (``target_modules="all-linear"``: attention and MLP projections, not the output head)
and saved with PEFT's own ``save_pretrained``, so the directory has exactly the layout engines load
(``adapter_config.json`` with the resolved module list + ``adapter_model.safetensors``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LORA_B_SCALE = 0.05
"""Standard deviation of the random lora_B entries: big enough that the adapter changes drawn tokens."""


def make_lora_adapter(base_dir: Path, out_dir: Path, rank: int = 4, seed: int = 0) -> Path:
    """Save a rank-``rank`` LoRA adapter for the checkpoint in ``base_dir`` to ``out_dir``, random from ``seed``.

    PEFT initialises lora_B to zero (an adapter that changes nothing), so both factors are filled
    here from a generator seeded with ``seed``: the same arguments always give the same adapter,
    whatever the global RNG state, and different seeds give adapters that draw different tokens.
    """
    import peft
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0)
    model: Any = peft.get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if ".lora_A." in name:  # (rank, in_features): PEFT's kaiming-uniform scale, but from our generator
                fan_in = parameter.shape[1]
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / fan_in**0.5)
            elif ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * LORA_B_SCALE)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def merge_lora_adapter(base_dir: Path, adapter_dir: Path, out_dir: Path) -> Path:
    """Save the checkpoint of ``base_dir`` with the adapter in ``adapter_dir`` merged into its weights to ``out_dir``.

    The reference an engine serving the adapter on top of the base must match: PEFT's own
    ``merge_and_unload`` (W + scaling * B @ A), saved as a plain HF checkpoint any engine loads.
    """
    import peft
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged: Any = peft.PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def scaled_adapter(source: Path, target: Path, factor: float) -> Path:
    """``source`` with every lora_B scaled by ``factor`` (an adapter trained part of the way)."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    (target / "adapter_config.json").write_text((source / "adapter_config.json").read_text())
    tensors = load_file(str(source / "adapter_model.safetensors"))
    scaled = {name: t * factor if ".lora_B." in name else t for name, t in tensors.items()}
    save_file(scaled, str(target / "adapter_model.safetensors"))
    return target


def int8_quantized(source: Path, target: Path) -> Path:
    """``source`` with each linear weight rounded to 8 bits per output row (symmetric), saved in float32."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight
                scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                weight.copy_((weight / scale).round().clamp(-127, 127) * scale)
    model.save_pretrained(target)
    return target
