"""Random-initialised Qwen2 causal LMs, the same weights for the same config and seed on every machine.

One construction serves both kinds of checkpoint our code makes from nothing: the built-in demo
model (:mod:`trainer.builtin`) and the tiny models the engine and TOPLOC checks and benches run
(:mod:`tests.support.tiny_model`). Each caller keeps its own config (their shapes, special tokens and
saved config files differ) and its own touches after init; what they share is that the weights
come from ``seed`` alone and that building one leaves the process's global torch RNG as it was,
so building a model mid-run does not shift whatever the caller samples next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import Qwen2Config


def random_qwen2(config: Qwen2Config, seed: int) -> Any:
    """A ``Qwen2ForCausalLM`` of ``config`` in float32, initialised from ``seed`` (not yet saved)."""
    import torch
    from transformers import Qwen2ForCausalLM

    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return Qwen2ForCausalLM(config).to(torch.float32)
    finally:
        torch.random.set_rng_state(generator_state)
