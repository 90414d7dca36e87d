"""Loading a causal LM and its tokenizer from a local HF checkpoint directory or a built-in name.

Any HF causal LM whose weights are safetensors loads; so does a vision-language one (a checkpoint with an
image processor, :func:`engines.vision.auto_model_class`: the same class the engines load it with). The
attention implementation is SDPA, which also handles packed sequences (the packing's block-diagonal mask).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engines.vision import VisionInputs, auto_model_class, never_draw_vision_tokens
from trainer.builtin import resolve_model_path
from trainer.transformers_logs import quiet_transformers

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(name: str, dtype: str = "float32", cache_dir: Path | None = None) -> PreTrainedModel:
    """The causal LM at ``name`` (a directory or ``builtin:...``) in ``dtype``, in train mode, on CPU."""
    quiet_transformers()
    path = resolve_model_path(name, cache_dir)
    vision = VisionInputs.of_checkpoint(path)
    loader: Any = auto_model_class(vision)
    model: PreTrainedModel = loader.from_pretrained(str(path), dtype=DTYPES[dtype], attn_implementation="sdpa")
    if vision is not None:  # as the engines load it: the policy never draws a vision token
        never_draw_vision_tokens(model, vision)
    model.train()
    return model


def load_vision_inputs(name: str, cache_dir: Path | None = None) -> VisionInputs | None:
    """The image processor and vision tokens of the checkpoint at ``name``; None for a text-only one."""
    return VisionInputs.of_checkpoint(resolve_model_path(name, cache_dir))


def load_tokenizer(name: str, cache_dir: Path | None = None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_path(name, cache_dir)))
