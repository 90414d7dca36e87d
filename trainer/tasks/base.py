"""The task interface: prompts, a verifiable reward, an eval set and SFT pairs, all from a seed.

A task is a deterministic, offline generator of examples. Example ``index`` of a task's
training stream is a pure function of (task seed, index), so the ledger, the orchestrator and
validators agree on a prompt from its index alone, without shipping text around. The eval set
is drawn from a separate stream, so it never overlaps the training prompts by construction
(only by coincidence of the generator).

To add a task, subclass :class:`Task`, implement :meth:`Task.example` and :meth:`Task.reward`,
and register it with :func:`trainer.tasks.register_task`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass

EVAL_STREAM_OFFSET = 1 << 40
"""Eval examples are drawn from indices at and above this offset of the same generator."""


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer (the SFT target; rewards compare against it)."""

    index: int
    prompt: str
    answer: str


class Task(ABC):
    """A task with a verifiable reward. Subclasses are cheap to build and hold no large state."""

    name: str
    """The registry name, e.g. ``reverse_text``."""
    success_threshold: float = 1.0
    """A completion whose reward is at least this counts as correct (accuracy)."""
    default_max_tokens: int = 32
    """A generation budget that fits every reference answer plus EOS."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def rng(self, index: int) -> random.Random:
        """The generator of example ``index``: independent of every other index."""
        return random.Random(f"{self.name}:{self.seed}:{index}")

    @abstractmethod
    def example(self, index: int) -> Example:
        """Training example ``index`` (any non-negative int); a pure function of (seed, index)."""

    @abstractmethod
    def reward(self, example: Example, completion: str) -> float:
        """The reward in [0, 1] of ``completion`` (decoded text, without EOS) for ``example``."""

    def eval_examples(self, num_examples: int) -> list[Example]:
        """The fixed eval set: the first ``num_examples`` of the eval stream."""
        return [self.example(EVAL_STREAM_OFFSET + i) for i in range(num_examples)]

    def sft_pairs(self, start: int, num_pairs: int) -> list[tuple[str, str]]:
        """(prompt, completion) pairs for supervised fine-tuning, from the training stream."""
        return [(ex.prompt, ex.answer) for ex in (self.example(start + i) for i in range(num_pairs))]

    def corpus(self, num_examples: int) -> list[str]:
        """Text to train a tokenizer on: prompts and answers of the first examples."""
        texts: list[str] = []
        for i in range(num_examples):
            ex = self.example(i)
            texts.extend([ex.prompt, ex.answer])
        return texts
