"""The shared random causal LM: its weights come from the seed alone, and building one leaves torch's RNG alone."""

from __future__ import annotations

import torch
from transformers import Qwen2Config

from engines.random_model import random_causal_lm

CONFIG = Qwen2Config(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def test_the_same_seed_gives_the_same_weights_and_the_global_rng_is_untouched() -> None:
    torch.manual_seed(7)
    expected_draw = torch.rand(3)
    torch.manual_seed(7)
    first, again, other = random_causal_lm(CONFIG, 0), random_causal_lm(CONFIG, 0), random_causal_lm(CONFIG, 1)
    assert torch.equal(torch.rand(3), expected_draw)
    weights = [dict(model.state_dict()) for model in (first, again, other)]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert not torch.equal(weights[0]["lm_head.weight"], weights[2]["lm_head.weight"])
    assert all(tensor.dtype == torch.float32 for tensor in weights[0].values())
