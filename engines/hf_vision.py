"""The HF engine's images: one batch's pixels, its image-token mask and its multimodal rotary positions.

A vision-language policy (Qwen2-VL shape) places each image's patches at the prompt's image tokens
and gives them positions in (time, height, width) (M-RoPE); text after an image continues from the
largest position the image used, so a row's next position is its length plus a per-row offset.
:func:`vision_batch` computes both for a left-padded batch with the model's own rule
(``get_rope_index``), once per forward pass that starts from the prompt; a decode step's text
position is then ``length + offset`` in all three axes. Each row's image tokens must stand for
exactly its images' patches: a prompt that does not (a worker's, say) is refused with a reason
rather than failing inside the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engines.vision import VisionInputs
from environments.images import Image


@dataclass(frozen=True)
class VisionBatch:
    """What a batch's forward pass from the prompt adds for its images."""

    model_inputs: dict[str, torch.Tensor]
    """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids``, for the model's forward."""
    position_ids: torch.Tensor
    """(3, batch, length): each token's position in time, height and width (padding: 0)."""
    offsets: torch.Tensor
    """(batch,): what a row's next text position adds to its number of tokens."""


def vision_batch(
    vision: VisionInputs,
    decoder: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows_images: Sequence[tuple[Image, ...]],
) -> VisionBatch | None:
    """The image inputs of a left-padded batch whose row ``i`` shows ``rows_images[i]``; None when no row has images
    (nor image tokens)."""
    for row, row_images in enumerate(rows_images):
        vision.check_image_tokens(input_ids[row], row_images, f"row {row}")
    images = tuple(image for row in rows_images for image in row)
    if not images:
        return None
    mask = vision.image_token_mask(input_ids)
    pixels = vision.pixel_inputs(images)
    grid = pixels.image_grid_thw.to(input_ids.device)
    position_ids, offsets = decoder.get_rope_index(input_ids, mask, grid, attention_mask=attention_mask)
    model_inputs = {
        "pixel_values": pixels.pixel_values.to(input_ids.device),
        "image_grid_thw": grid,
        "mm_token_type_ids": mask,
    }
    return VisionBatch(model_inputs, position_ids, offsets.reshape(-1))
