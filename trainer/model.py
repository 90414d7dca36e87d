"""Loading a causal LM and its tokenizer from a local HF checkpoint directory or a built-in name.

Any HF causal LM whose weights are safetensors loads; the attention implementation is SDPA,
which also handles packed sequences (position ids restarting at 0 give a block-diagonal mask).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.builtin import resolve_model_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def quiet_transformers() -> None:
    """No per-file progress bars from transformers: our logs carry one line per event."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_model(name: str, dtype: str = "float32", cache_dir: Path | None = None) -> PreTrainedModel:
    """The causal LM at ``name`` (a directory or ``builtin:...``) in ``dtype``, in train mode, on CPU."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    path = resolve_model_path(name, cache_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype], attn_implementation="sdpa")
    model.train()
    return model


def load_tokenizer(name: str, cache_dir: Path | None = None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_path(name, cache_dir)))
