"""Random-initialised causal LMs of any HF architecture, the same weights for the same config and seed.

One construction serves every checkpoint our code makes from nothing: the built-in demo model
(:mod:`trainer.builtin`), the benches' models and the tiny models the engine, TOPLOC and
architecture checks run (:mod:`tests.support.tiny_model`: Qwen2 tied and untied, Qwen3, Llama 3,
Qwen3-MoE). Each caller keeps its own config (their shapes, special tokens and saved config files
differ) and its own touches after init; what they share is that the weights come from ``seed``
alone and that building one leaves the process's global torch RNG as it was, so building a model
mid-run does not shift whatever the caller samples next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def random_causal_lm(config: PretrainedConfig, seed: int, image_text: bool = False) -> Any:
    """The causal LM of ``config``'s architecture (``AutoModelForCausalLM``; ``image_text``: a vision-language model,
    ``AutoModelForImageTextToText``), float32, initialised from ``seed``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto_class: Any = AutoModelForImageTextToText if image_text else AutoModelForCausalLM
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return auto_class.from_config(config, dtype=torch.float32).to(torch.float32)
    finally:
        torch.random.set_rng_state(generator_state)
