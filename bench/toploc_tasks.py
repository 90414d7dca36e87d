"""The TOPLOC benches' policies and prompts: random Qwen2 sizes by name, sample tasks at several temperatures.

:data:`MODELS` names the random Qwen2 shapes (tests.support.tiny_model) a TOPLOC bench's policy can take;
:func:`make_tasks` makes the sample tasks (prompts of 1 to 48 tokens, temperatures cycling through
:data:`TEMPERATURES`) the policy generates for. Used by bench/toploc_calibrate.py and bench/substitution_bench.py.
"""

from __future__ import annotations

import random

from protocol.schemas import SamplingParams
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, TinyModelSpec
from toploc.sampling import sample_stream
from toploc.verify import SampleTask

TEMPERATURES = (0.7, 1.0, 1.3)
"""The sampling temperatures of the tasks, prompt by prompt in turn."""
MODELS = {
    "tiny": TinyModelSpec(),
    # The tiny model with 32-wide attention heads: vLLM's CPU attention has no kernel for 16-wide ones.
    "tiny-heads32": TinyModelSpec(num_attention_heads=2, num_key_value_heads=1),
    # ~50M parameters (two 16.8M embedding matrices, 8 x 2.8M layers); the head scaled so logits have about
    # the tiny model's spread (~1.3 nats), the EOS bias raised for its 32x larger vocabulary.
    "medium": TinyModelSpec(
        vocab_size=32768,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        logit_scale=2.8,
        eos_bias=4.0,
    ),
}
"""The policy's shape by its ``--model`` name."""


def make_tasks(num_prompts: int, group_size: int, max_tokens: int, vocab_size: int, seed: int) -> list[SampleTask]:
    """Prompts of 1 to 48 tokens, ``group_size`` samples each, temperatures cycling through TEMPERATURES."""
    rng = random.Random(seed)
    tasks = []
    for prompt_index in range(num_prompts):
        prompt = [rng.randrange(2, vocab_size) for _ in range(rng.randint(1, 48))]
        sampling = SamplingParams(temperature=TEMPERATURES[prompt_index % 3], max_tokens=max_tokens)
        for sample_index in range(group_size):
            tasks.append(
                SampleTask(
                    prompt_ids=prompt,
                    sampling=sampling,
                    seed=seed * 1000 + prompt_index,
                    stream=sample_stream(prompt_index, sample_index),
                    eos_token_ids=(TINY_EOS_TOKEN_ID,),
                )
            )
    return tasks
