"""What a vision-language policy sees of an image: its pixel patches, and the prompt tokens that stand for it.

A Qwen2-VL-shaped checkpoint carries its image processor (``preprocessor_config.json``) and the ids of
its vision tokens (``config.json``). :class:`VisionInputs` reads both, once, and is the one place every
party turns an :class:`~environments.images.Image` into model inputs: a worker generating, a validator
prefilling and the trainer computing log-probabilities all call :meth:`VisionInputs.pixel_inputs`, so
they see the same patches, and :meth:`VisionInputs.image_block` writes the prompt text that holds an
image's place (``<|vision_start|>``, one ``<|image_pad|>`` per merged patch, ``<|vision_end|>``), so the
prompt's token ids say how many patches each image has. The image processor is transformers' PIL one:
it needs no torchvision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from environments.images import Image

PREPROCESSOR_CONFIG = "preprocessor_config.json"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True)
class PixelInputs:
    """A prompt's images as the model takes them: patches of every image, concatenated, and each image's grid."""

    pixel_values: torch.Tensor
    """(patches, channels x temporal patch x patch x patch), float32."""
    image_grid_thw: torch.Tensor
    """(images, 3): each image's patch grid (time, height, width), int64."""


class VisionInputs:
    """A vision-language checkpoint's image processor and vision tokens (module docstring)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import Qwen2VLImageProcessorPil

        config = json.loads((model_dir / "config.json").read_text())
        self.image_token_id = int(config["image_token_id"])
        self.vision_start_token_id = int(config["vision_start_token_id"])
        self.vision_end_token_id = int(config["vision_end_token_id"])
        self.processor: Any = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))
        self.merge_size = int(self.processor.merge_size)

    @staticmethod
    def of_checkpoint(model_dir: Path) -> VisionInputs | None:
        """The checkpoint's vision inputs; None for a text-only checkpoint (no image processor or image token)."""
        if not (model_dir / PREPROCESSOR_CONFIG).is_file():
            return None
        config = json.loads((model_dir / "config.json").read_text())
        return VisionInputs(model_dir) if "image_token_id" in config else None

    def pixel_inputs(self, images: tuple[Image, ...]) -> PixelInputs:
        """The model's inputs for ``images`` (at least one)."""
        if not images:
            raise ValueError("pixel_inputs needs at least one image")
        features = self.processor(images=[image.to_pil() for image in images], return_tensors="pt")
        return PixelInputs(features["pixel_values"].float(), features["image_grid_thw"].long())

    def num_image_tokens(self, image: Image) -> int:
        """How many prompt tokens stand for ``image``: its patches after the merge, from its size alone (the
        processor's own resize rule; no pixels are processed)."""
        patches = int(self.processor.get_number_of_image_patches(image.height, image.width))
        return patches // (self.merge_size * self.merge_size)

    def tokens_per_image(self, image_grid_thw: torch.Tensor) -> list[int]:
        """How many prompt tokens stand for each image of processed inputs (``PixelInputs.image_grid_thw``)."""
        return (image_grid_thw.prod(-1) // (self.merge_size * self.merge_size)).tolist()

    def image_block(self, image: Image) -> str:
        """The prompt text that holds ``image``'s place."""
        return VISION_START + IMAGE_PAD * self.num_image_tokens(image) + VISION_END

    def image_token_mask(self, token_ids: torch.Tensor) -> torch.Tensor:
        """1 where ``token_ids`` holds an image's place, else 0 (the model's ``mm_token_type_ids``)."""
        return (token_ids == self.image_token_id).long()
