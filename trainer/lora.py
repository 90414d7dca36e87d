"""LoRA training: PEFT adapters on the model's linear layers, their state, and the two exports.

:func:`apply_lora` wraps the loaded HF model with PEFT's LoRA before FSDP2 shards it (the base
weights frozen, the adapters trainable, so the optimizer, gradient clipping and checkpoints hold
the adapters alone). A LoRA policy is exported two ways:

- :func:`adapter_tensors`: the adapter in PEFT's on-disk layout (``adapter_model.safetensors``
  keys ``base_model.model.<module>.lora_A.weight``, and ``adapter_config.json``), which PEFT,
  the HF engine and vLLM load on top of the base. A network run publishes this, a few MB a version.
- :func:`merged_tensors`: the base with each adapter folded in (``W + alpha / r * B @ A``), an
  ordinary HF checkpoint for anything that knows no adapters (the run's final model).

On a mixture-of-experts model (Qwen3-MoE) ``all-linear`` also adapts the router and the experts, which
``transformers`` keeps as one stacked tensor per block: PEFT adapts those parameters directly (its
``target_parameters``), with one rank-r adapter per expert held in one A and one B (:class:`LoraSite`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engines.adapters import PEFT_PREFIX
from trainer.config import LoraConfig

_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
"""What torch's activation-checkpoint wrapper puts in module names (state dicts leave it out)."""
_BASE_LAYER = re.compile(r"\.base_layer(?=\.)")
"""PEFT's name of the layer (or layer in a layer, per adapted parameter) an adapter wraps."""

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
    try:
        wrapped: nn.Module = get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    except ValueError as exc:
        if "ParamWrapper" in str(exc) and config.dropout:  # PEFT adapts an MoE model's experts as parameters
            raise ValueError(
                f"lora.dropout = {config.dropout} cannot apply to {base_name}'s stacked experts; set lora.dropout = 0"
            ) from exc
        raise
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


def adapter_config_json(model: nn.Module) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` content, as PEFT writes it."""
    config = _adapter_config(model)
    content: dict[str, Any] = config.to_dict()
    # PEFT resolves `all-linear` to every module's full name; the layer names alone say the same for any depth,
    # and are what vLLM matches an adapter's modules against.
    targets = content.get("target_modules") or []
    content["target_modules"] = sorted({name.rpartition(".")[2] for name in targets})
    # PEFT keeps some lists (an MoE model's adapted expert parameters) as sets.
    return {key: sorted(value) if isinstance(value, (set, frozenset)) else value for key, value in content.items()}


def _lora_part(name: str) -> tuple[str, str] | None:
    """(module, "lora_A" or "lora_B") of a trainer state name ``<module>.lora_A.default.weight``, else None."""
    for part in ("lora_A", "lora_B"):
        suffix = f".{part}.{ADAPTER_NAME}.weight"
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    return None


def adapter_file_name(name: str) -> str | None:
    """The name PEFT's adapter file gives the trainer state entry ``name``; None for an entry that is no adapter."""
    found = _lora_part(name)
    return None if found is None else f"{found[0]}.{found[1]}.weight"


def trained_names(model: nn.Module) -> list[str]:
    """The state names of the parameters that train, as full state dicts name them (activation checkpointing's
    wrapper left out of the path)."""
    return [name.replace("_checkpoint_wrapped_module.", "") for name, p in model.named_parameters() if p.requires_grad]


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter weights of a PEFT model's full state dict, named as PEFT's files name them."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        file_name = adapter_file_name(name)
        if file_name is not None:
            tensors[file_name] = tensor
    if not tensors:
        raise ValueError("the model holds no LoRA adapter weights")
    return tensors


@dataclass(frozen=True)
class LoraSite:
    """One adapted weight of a PEFT model, in the names of its state dict: where its adapter lives and how it folds
    into the weight."""

    module: str
    """The PEFT layer holding the adapter (its ``lora_A``/``lora_B``)."""
    weight: str
    """The base weight the adapter adds to."""
    experts: int
    """1 for a linear layer; E for a stack of E experts' matrices in one tensor (PEFT's ``target_parameters``),
    where A is (E * r, in) and B is (out, r * E)."""
    in_last: bool
    """The weight is (..., out, in), as linear layers keep it; else (E, in, out)."""
    scale: float
    """``alpha / r`` of this layer."""


def lora_sites(model: nn.Module) -> list[LoraSite]:
    """Every weight ``model`` (a PEFT model, sharded or not) adapts: linear layers and stacked expert parameters."""
    from peft.tuners.lora import Linear, ParamWrapper
    from peft.tuners.tuners_utils import BaseTunerLayer

    sites: list[LoraSite] = []
    for raw_name, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer) or ADAPTER_NAME not in getattr(module, "lora_A", {}):
            continue
        name = raw_name.replace(_CHECKPOINT_PREFIX, "")
        layer: Any = module
        scale = float(layer.scaling[ADAPTER_NAME])
        if isinstance(module, ParamWrapper):
            inner: Any = layer.base_layer
            path = f"{name}.base_layer"
            while isinstance(inner, BaseTunerLayer):  # PEFT nests one wrapper per adapted parameter of a module
                inner, path = getattr(inner, "base_layer"), f"{path}.base_layer"  # noqa: B009  # typed Any
            stacked = layer.get_param().dim() == 3
            in_last = not stacked or bool(layer._did_swap_in_out_features)
            sites.append(LoraSite(name, f"{path}.{layer.parameter_name}", layer.num_experts, in_last, scale))
        elif isinstance(module, Linear) and not layer.fan_in_fan_out:
            sites.append(LoraSite(name, f"{name}.base_layer.weight", 1, True, scale))
        else:
            raise ValueError(f"LoRA on {type(module).__name__} layers ({name}) is not supported; adapt linear layers")
    return sites


def lora_delta(a: torch.Tensor, b: torch.Tensor, site: LoraSite) -> torch.Tensor:
    """What the adapter (A, B) adds to ``site``'s weight, per expert (float32, E x out x in, or E x in x out for a
    stack kept that way): ``scale * B @ A``, where expert e's A is rows e*r..(e+1)*r of A and its B the columns
    e, E + e, 2E + e, ... of B (PEFT's layout; a linear layer is one expert)."""
    experts = site.experts
    rank = a.shape[0] // experts
    per_expert = torch.einsum(
        "ore,eri->eoi", b.float().reshape(b.shape[0], rank, experts), a.float().reshape(experts, rank, a.shape[1])
    )
    return site.scale * (per_expert if site.in_last else per_expert.transpose(1, 2))


def merged_tensors(state: dict[str, torch.Tensor], sites: list[LoraSite]) -> dict[str, torch.Tensor]:
    """The HF model's own state (its names, no adapter entries) with every adapter folded into its weight."""
    by_weight = {site.weight: site for site in sites}
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if _lora_part(name) is not None:
            continue
        site = by_weight.get(name)
        if site is not None:
            a, b = (state[f"{site.module}.{part}.{ADAPTER_NAME}.weight"] for part in ("lora_A", "lora_B"))
            delta = lora_delta(a, b, site)
            if tensor.dim() == 2:
                delta = delta.squeeze(0)
            if delta.shape != tensor.shape:
                shapes = f"{tuple(delta.shape)} to a weight of {tuple(tensor.shape)}"
                raise ValueError(f"the adapter of {site.module} adds {shapes}")
            tensor = (tensor.float() + delta).to(tensor.dtype)
        merged[_BASE_LAYER.sub("", name).removeprefix(PEFT_PREFIX)] = tensor
    return merged
