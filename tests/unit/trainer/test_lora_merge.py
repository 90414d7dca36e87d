"""The merged export of a LoRA policy: every adapter folded into its weight as PEFT's own merge folds it,
a mixture-of-experts model's stacked experts and router included."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.tiny_model import TinyModelSpec, save_tiny_model
from trainer.config import LoraConfig
from trainer.lora import apply_lora, lora_sites, merged_tensors


def _peft_model(base_dir: Path) -> Any:
    """``base_dir``'s model under all-linear LoRA (rank 4, alpha 8) with random, non-zero adapters."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    wrapped: Any = apply_lora(model, LoraConfig(enabled=True, rank=4, alpha=8), str(base_dir))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if ".lora_B." in name:  # PEFT starts B at zero: an adapter that changes nothing
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return wrapped


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3_moe"])
def test_merged_tensors_are_what_peft_merges(architecture: str, tmp_path: Path) -> None:
    spec = TinyModelSpec(architecture=architecture, num_attention_heads=2, num_key_value_heads=1)  # type: ignore[arg-type]
    base_dir = save_tiny_model(tmp_path / "base", seed=0, spec=spec)
    model = _peft_model(base_dir)
    sites = lora_sites(model)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    merged = merged_tensors(state, sites)

    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6)
    if architecture == "qwen3_moe":  # the stacked experts are adapted, one adapter per expert: every expert moved
        assert {"gate_up_proj", "down_proj", "weight"} == {site.weight.rpartition(".")[2] for site in sites}
        before = state["base_model.model.model.layers.0.mlp.experts.base_layer.base_layer.gate_up_proj"]
        moved = (merged["model.layers.0.mlp.experts.gate_up_proj"] - before).abs().amax(dim=(1, 2))
        assert moved.shape == (4,) and bool((moved > 0).all())


def test_dropout_on_an_moe_model_is_refused_in_one_line(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    spec = TinyModelSpec(architecture="qwen3_moe", num_attention_heads=2, num_key_value_heads=1)
    base_dir = save_tiny_model(tmp_path / "base", seed=0, spec=spec)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"set lora\.dropout = 0"):
        apply_lora(model, LoraConfig(enabled=True, rank=4, dropout=0.1), str(base_dir))
