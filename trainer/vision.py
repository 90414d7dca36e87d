"""What the trainer takes from a vision-language model: its vision tower (frozen by default) and its positions.

The vision tower is the image encoder with its merger into the text model's width (Qwen2-VL's ``visual``);
:func:`freeze_vision_tower` turns its parameters' gradients off before the optimizer is built, so only the
text model trains. :func:`sample_positions` is the model's own M-RoPE rule (``get_rope_index``, which reads
only the config) for one sample at a time, as :class:`trainer.packing.VisionPacking` takes it: packing stays
free of the model, and every sample's positions start at 0 as they do when it is run alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from protocol.errors import ConfigError
from trainer.packing import SamplePositions

TOWER_NAMES = ("visual", "vision_tower", "vision_model")
"""Where HF vision-language models keep their image encoder (Qwen2-VL and Qwen2.5-VL; LLaVA-style; Idefics-style)."""


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The model's image encoder (the first submodule held under one of :data:`TOWER_NAMES`), or None."""
    for module in model.modules():
        for name in TOWER_NAMES:
            tower = getattr(module, name, None)
            if isinstance(tower, nn.Module):
                return tower
    return None


def freeze_vision_tower(model: nn.Module) -> int:
    """Turn off the gradients of the vision tower's parameters; returns how many parameters (elements) that froze.
    ConfigError for a model without one."""
    tower = vision_tower(model)
    if tower is None:
        raise ConfigError(
            f"{type(model).__name__} has no vision tower to freeze (no {' / '.join(TOWER_NAMES)} module); "
            "set trainer freeze_vision = false"
        )
    frozen = 0
    for parameter in tower.parameters():
        parameter.requires_grad_(False)
        frozen += parameter.numel()
    return frozen


def sample_positions(model: nn.Module) -> SamplePositions:
    """The model's positions of one sample (its ``get_rope_index``); ConfigError for a model without that rule."""
    owner: Any = next((m for m in model.modules() if callable(getattr(m, "get_rope_index", None))), None)
    if owner is None:
        raise ConfigError(f"{type(model).__name__} has no get_rope_index: the trainer packs Qwen2-VL-shaped models")

    def positions(
        input_ids: torch.Tensor, image_token_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
    ) -> torch.Tensor:
        found, _ = owner.get_rope_index(
            input_ids.reshape(1, -1), image_token_mask.reshape(1, -1), image_grid_thw=image_grid_thw
        )
        result: torch.Tensor = found[:, 0]
        return result

    return positions
