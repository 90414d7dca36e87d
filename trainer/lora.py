"""LoRA training: PEFT adapters on the model's linear layers, their state, and the two exports.

:func:`apply_lora` wraps the loaded HF model with PEFT's LoRA before FSDP2 shards it (the base
weights frozen, the adapters trainable, so the optimizer, gradient clipping and checkpoints hold
the adapters alone). A LoRA policy is exported two ways:

- :func:`adapter_tensors`: the adapter in PEFT's on-disk layout (``adapter_model.safetensors``
  keys ``base_model.model.<module>.lora_A.weight``, and ``adapter_config.json``), which PEFT,
  the HF engine and vLLM load on top of the base. A network run publishes this, a few MB a version.
- :func:`merged_tensors`: the base with each adapter folded in (``W + alpha / r * B @ A``), an
  ordinary HF checkpoint for anything that knows no adapters (the run's final model).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engines.adapters import PEFT_PREFIX
from trainer.config import LoraConfig

ADAPTER_NAME = "default"
"""PEFT's name of the one adapter the trainer trains (it appears in module names, never in files)."""


def apply_lora(model: nn.Module, config: LoraConfig, base_name: str) -> nn.Module:
    """``model`` with LoRA adapters on ``config.target_modules`` (PEFT's PeftModel): only they train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by alpha / r, floats work
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        base_model_name_or_path=base_name,
        bias="none",
    )
    wrapped: nn.Module = get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    return wrapped


def is_lora(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def base_model(model: nn.Module) -> nn.Module:
    """The HF model inside a PEFT model (its adapters injected in its modules)."""
    peft_model: Any = model
    base: nn.Module = peft_model.get_base_model()
    return base


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _adapter_config(model: nn.Module) -> Any:
    """PEFT's config of the trained adapter."""
    peft_model: Any = model
    return peft_model.peft_config[ADAPTER_NAME]


def lora_scale(model: nn.Module) -> float:
    config = _adapter_config(model)
    return float(config.lora_alpha) / float(config.r)


def adapter_config_json(model: nn.Module) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` content, as PEFT writes it."""
    config = _adapter_config(model)
    content: dict[str, Any] = config.to_dict()
    # PEFT resolves `all-linear` to every module's full name; the layer names alone say the same for any depth,
    # and are what vLLM matches an adapter's modules against.
    targets = content.get("target_modules") or []
    content["target_modules"] = sorted({name.rpartition(".")[2] for name in targets})
    return content


def _lora_part(name: str) -> tuple[str, str] | None:
    """(module, "lora_A" or "lora_B") of a trainer state name ``<module>.lora_A.default.weight``, else None."""
    for part in ("lora_A", "lora_B"):
        suffix = f".{part}.{ADAPTER_NAME}.weight"
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    return None


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter weights of a PEFT model's full state dict, named as PEFT's files name them."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        found = _lora_part(name)
        if found is not None:
            module, part = found
            tensors[f"{module}.{part}.weight"] = tensor
    if not tensors:
        raise ValueError("the model holds no LoRA adapter weights")
    return tensors


def merged_tensors(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The HF model's own state (its names, no adapter entries) with every adapter folded into its weight."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        found = _lora_part(name)
        if found is not None:
            pairs.setdefault(found[0], {})[found[1]] = tensor
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if _lora_part(name) is not None:
            continue
        module, _, leaf = name.rpartition(".")
        if module.endswith(".base_layer"):
            owner = module.removesuffix(".base_layer")
            if leaf == "weight" and owner in pairs:
                a, b = pairs[owner]["lora_A"], pairs[owner]["lora_B"]
                tensor = (tensor.float() + scale * (b.float() @ a.float())).to(tensor.dtype)
            name = f"{owner}.{leaf}"
        merged[name.removeprefix(PEFT_PREFIX)] = tensor
    return merged
