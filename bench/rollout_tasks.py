"""The rollout benches' tasks: a bench environment of letter prompts, and tasks shaped like the coordinator's.

:class:`BenchEnvironment` is the environment of a bench run's coordinator (``target =
"bench.rollout_tasks:BenchEnvironment"``); :func:`local_task` renders its prompts into a task as the
coordinator would, for an engine measured alone. Used by bench/rollout_bench.py and bench/validator_bench.py.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from environments.base import Environment, Example, Scores
from environments.prompts import EnvironmentPrompts
from protocol.schemas import SamplingParams, Task

TASK_NAME = "bench"
PROMPTS_PER_TASK = 8
GROUP_SIZE = 8


class BenchEnvironment(Environment):
    """Example i: 16 pseudo-random letters, space-separated (about 16 tokens of the built-in tokenizer)."""

    name = TASK_NAME

    def example(self, index: int) -> Example:
        generator = torch.Generator().manual_seed(index)
        letters = [chr(ord("a") + int(c)) for c in torch.randint(0, 26, (16,), generator=generator)]
        return Example(index=index, prompt=" ".join(letters) + "\n")

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("length", float(len(completion)))


@functools.cache
def builtin_tokenizer() -> Any:
    """The built-in model's tokenizer (what the coordinator renders the bench's prompts with)."""
    from transformers import AutoTokenizer

    from trainer.resolve import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path("builtin:tiny-qwen2")))


def local_task(index: int, max_tokens: int, tokenizer: Any = None) -> Task:
    """A task shaped like the coordinator's, for the engine-alone measurement."""
    source = EnvironmentPrompts(BenchEnvironment(), tokenizer or builtin_tokenizer())
    prompts = [
        {"prompt_index": i, "token_ids": list(prompt.token_ids)}
        for i, prompt in enumerate(source.prompt_group(10_000 + index, PROMPTS_PER_TASK))
    ]
    return Task.model_validate(
        {
            "task_id": f"local-{index}",
            "lease_id": f"local-{index}",
            "task_name": TASK_NAME,
            "prompts": prompts,
            "group_size": GROUP_SIZE,
            "sampling": SamplingParams(temperature=1.0, max_tokens=max_tokens).model_dump(),
            "policy_version": 0,
            "sampling_seed": 1000 + index,
            "deadline": time.time() + 600,
        }
    )
