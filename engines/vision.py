"""What a vision-language policy sees of an image: its pixel patches, and the prompt tokens that stand for it.

A Qwen2-VL-shaped checkpoint carries its image processor (``preprocessor_config.json``) and the ids of
its vision tokens (``config.json``). :class:`VisionInputs` reads both, once, and is the one place every
party turns an :class:`~environments.images.Image` into model inputs: a worker generating, a validator
prefilling and the trainer computing log-probabilities all call :meth:`VisionInputs.pixel_inputs`, so
they see the same patches, and :meth:`VisionInputs.image_block` writes the prompt text that holds an
image's place (``<|vision_start|>``, one ``<|image_pad|>`` per merged patch, ``<|vision_end|>``), so the
prompt's token ids say how many patches each image has. The image processor is transformers' PIL one:
it needs no torchvision. :func:`auto_model_class` is the one rule for which transformers class loads a
checkpoint, so the engines and the trainer load the same model from it, and :func:`never_draw_vision_tokens`
keeps a policy from drawing a token that holds an image's place.
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
        placeholders = [self.image_token_id, self.vision_start_token_id, self.vision_end_token_id]
        video = config.get("video_token_id")
        self.never_drawn_ids = tuple(sorted({*placeholders, *([int(video)] if video is not None else [])}))
        """The tokens that hold an image's (or a video's) place: never drawn (:func:`never_draw_vision_tokens`)."""
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

    def check_image_tokens(self, token_ids: torch.Tensor, images: tuple[Image, ...], where: str) -> None:
        """ValueError (naming ``where``) unless the sequence ``token_ids`` holds exactly the image tokens ``images``
        take: the model puts an image's features at every image token, so any other count cannot be computed."""
        found = int(self.image_token_mask(token_ids).sum())
        expected = sum(self.num_image_tokens(image) for image in images)
        if found != expected:
            none = "" if images else " (no images were given for them)"
            raise ValueError(
                f"{where} holds {found} image tokens, but its {len(images)} image(s) take {expected}{none}; its "
                "prompt must be rendered with the policy's image blocks, one per image, and its completion hold none"
            )

    def image_block(self, image: Image) -> str:
        """The prompt text that holds ``image``'s place."""
        return VISION_START + IMAGE_PAD * self.num_image_tokens(image) + VISION_END

    def image_token_mask(self, token_ids: torch.Tensor) -> torch.Tensor:
        """1 where ``token_ids`` holds an image's place, else 0 (the model's ``mm_token_type_ids``)."""
        return (token_ids == self.image_token_id).long()


NEVER_DRAWN_LOGIT = -1e9
"""The logit every party's forward gives a vision token: its probability is exactly 0 at any temperature, and
log-probabilities and entropies stay finite in float32 and bfloat16 (a float16 engine's head makes it -inf, which
no draw or check reads)."""


def never_draw_vision_tokens(model: Any, vision: VisionInputs) -> None:
    """Make ``model``'s output head give its vision tokens (:attr:`VisionInputs.never_drawn_ids`) the logit
    :data:`NEVER_DRAWN_LOGIT`, so a policy never draws one.

    A prompt's image tokens are where its images go: a model's forward places image features at every one of
    them, so a completion holding one could not be prefilled (by a validator, by the trainer) as the engine that
    drew it saw it, a token among text. The workers' engines, the validators' prefills and the trainer all load a
    vision-language policy with this hook, so the distribution they sample, check and train is the same."""
    ids = torch.tensor(vision.never_drawn_ids, dtype=torch.long)

    def hook(_module: Any, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, ids.to(logits.device), NEVER_DRAWN_LOGIT)

    model.get_output_embeddings().register_forward_hook(hook)


def never_drawn(engine: Any) -> frozenset[int]:
    """The tokens ``engine``'s policy never draws (:func:`never_draw_vision_tokens`): a vision-language policy's
    vision tokens, none for a text one. A completion holding one was not drawn by that policy."""
    vision = getattr(engine, "vision", None)
    return frozenset(vision.never_drawn_ids) if isinstance(vision, VisionInputs) else frozenset()


def auto_model_class(vision: VisionInputs | None) -> Any:
    """The transformers auto class a checkpoint loads with: ``AutoModelForImageTextToText`` for a vision-language
    one (``vision``, from :meth:`VisionInputs.of_checkpoint`), else ``AutoModelForCausalLM``. Both give a model whose
    forward returns the logits of every position; a vision-language one also takes the images' inputs."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForCausalLM if vision is None else AutoModelForImageTextToText
