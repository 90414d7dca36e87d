"""Loading a causal LM and its tokenizer from a local HF checkpoint directory or a built-in name.

Any HF causal LM whose weights are safetensors loads; the attention implementation is SDPA,
which also handles packed sequences (position ids restarting at 0 give a block-diagonal mask).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.builtin import resolve_model_path
from trainer.transformers_logs import quiet_transformers

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
