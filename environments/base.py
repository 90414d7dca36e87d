"""The environment interface: example ``index`` -> prompt and scorer data; ``score`` -> named, weighted rewards.

An :class:`Environment` is a deterministic generator of :class:`Example` s. Example ``index``
of the training stream is a pure function of (environment config, index); the eval set holds
examples no training index produces (:mod:`environments.held_out` says how each adapter splits).
:meth:`Environment.score` reads a completion (decoded text, without EOS) with the
environment's own parser and returns :class:`Scores`: each named reward, its weight, and the
weighted total that training uses. Rewards are finite floats (:class:`Scores` refuses
anything else, so a broken scorer fails loudly instead of training on NaN).

To bring your own environment, subclass :class:`Environment` (or implement the same methods)
and name it in ``[environment]`` as ``type = "python"``, ``target = "module:attribute"``.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from environments.held_out import MAX_DRAWS, is_held_out
from environments.images import Image, image_hashes

TruncatedRule = Literal["minimum", "score"]
"""``minimum``: a truncated completion earns no credit; ``score``: it is scored like any other."""

EVAL_STREAM_OFFSET = 1 << 40
"""Eval examples are drawn from indices at and above this offset of the same generator."""


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat prompt."""

    role: str
    """``system``, ``user`` or ``assistant``."""
    content: str


@dataclass(frozen=True)
class Example:
    """One prompt with what its scorer needs."""

    index: int
    prompt: str | tuple[ChatMessage, ...]
    """Plain text (sent as is) or chat messages (rendered with the policy's chat template)."""
    answer: str | None = None
    """A reference completion: the SFT target, when the environment has one."""
    data: Any = field(default=None, compare=True)
    """Whatever the scorer needs beyond the prompt (a dataset row, a task object); compared by ``==``."""
    images: tuple[Image, ...] = ()
    """The prompt's images, in order, shown to the policy before the text of its first user message; made from
    (config, index) like the rest of the example, and pinned by their hashes (:mod:`environments.images`)."""


@dataclass(frozen=True)
class Scores:
    """Named rewards of one completion and their weights; :attr:`total` is what training optimises."""

    rewards: Mapping[str, float]
    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if set(self.rewards) != set(self.weights):
            raise ValueError(
                f"rewards {sorted(self.rewards)} and weights {sorted(self.weights)} name different rewards"
            )
        for name, value in [*self.rewards.items(), *self.weights.items()]:
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"reward {name!r}: {value!r} is not a finite number")

    @property
    def total(self) -> float:
        return float(sum(self.weights[name] * value for name, value in self.rewards.items()))

    @classmethod
    def single(cls, name: str, value: float) -> Scores:
        return cls({name: float(value)}, {name: 1.0})


def finite_scores(scores: object) -> Scores:
    """``scores`` if it is :class:`Scores` of finite numbers with a finite total; ValueError naming what is wrong
    otherwise (a scorer may return something else entirely, or change a :class:`Scores` after its checks)."""
    if not isinstance(scores, Scores):
        raise ValueError(f"score() returned {type(scores).__name__}, not Scores")
    for name, value in [*scores.rewards.items(), *scores.weights.items()]:
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"reward {name!r} is {value!r}, not a finite number")
    if not math.isfinite(scores.total):
        raise ValueError(f"the weighted total {scores.total!r} is not a finite number")
    return scores


def failure_summary(exc: BaseException, limit: int = 200) -> str:
    """How an environment's failure is reported: ``Type: message`` on one line, at most ``limit`` characters."""
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Environment(ABC):
    """A source of examples with a verifiable reward. Cheap to query; holds no per-request state."""

    name: str = "environment"
    """A short name for people and the ledger (at most 64 characters)."""
    system_prompt: str | None = None
    """Prepended as a system message to chat prompts."""
    default_max_tokens: int = 32
    """A generation budget that fits a good completion plus EOS."""
    success_threshold: float = 1.0
    """A completion whose total reward is at least this counts as correct (accuracy)."""
    truncated: TruncatedRule = "minimum"
    """How a completion cut at ``max_tokens`` without EOS is valued (:mod:`environments.truncation`); the loader
    sets the section's ``truncated``."""

    @abstractmethod
    def example(self, index: int) -> Example:
        """Training example ``index`` (any non-negative int); a pure function of (config, index)."""

    @abstractmethod
    def score(self, example: Example, completion: str) -> Scores:
        """The named rewards of ``completion`` (decoded text, without EOS) for ``example``."""

    def eval_example(self, number: int) -> Example:
        """Example ``number`` of the fixed eval set."""
        return self.example(EVAL_STREAM_OFFSET + number)

    def reward(self, example: Example, completion: str) -> float:
        """The weighted total of :meth:`score`."""
        return self.score(example, completion).total

    def eval_examples(self, num_examples: int) -> list[Example]:
        """The first ``num_examples`` of the eval set."""
        return [self.eval_example(i) for i in range(num_examples)]

    def sft_examples(self, start: int, num_examples: int) -> list[Example]:
        """Training examples with a reference answer, for supervised fine-tuning."""
        examples = [self.example(start + i) for i in range(num_examples)]
        missing = [ex.index for ex in examples if ex.answer is None]
        if missing:
            raise ValueError(
                f"environment {self.name!r} has no reference answer for example {missing[0]}; SFT needs one"
            )
        return examples

    def corpus(self, num_examples: int) -> list[str]:
        """Text to train a tokenizer on: prompts and answers of the first examples."""
        return [text for i in range(num_examples) for text in _texts(self.example(i))]


def _texts(example: Example) -> list[str]:
    """An example's prompt text and reference answer (tokenizer training text)."""
    prompt = example.prompt if isinstance(example.prompt, str) else "\n".join(m.content for m in example.prompt)
    return [prompt] if example.answer is None else [prompt, example.answer]


class SeededEnvironment(Environment):
    """An environment that draws example ``index`` from its own :class:`random.Random` (the built-ins).

    Subclasses implement :meth:`draw`. Training and eval are split on content
    (:mod:`environments.held_out`): example ``index`` is the first draw of its generator whose prompt is on
    the training side, eval example ``number`` the first draw of its own generator on the held-out side.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @abstractmethod
    def draw(self, index: int, rng: random.Random) -> Example:
        """An example drawn from ``rng`` (its ``index`` is ``index``)."""

    def rng(self, index: int, attempt: int = 0) -> random.Random:
        """The generator of draw ``attempt`` of example ``index``: independent of every other (index, attempt)."""
        suffix = f":{attempt}" if attempt else ""
        return random.Random(f"{self.name}:{self.seed}:{index}{suffix}")

    def _first_draw(self, index: int, stream: int, held_out: bool) -> Example:
        for attempt in range(MAX_DRAWS):
            example = self.draw(index, self.rng(stream, attempt))
            if is_held_out(example.prompt, image_hashes(example.images)) == held_out:
                return example
        split = "eval" if held_out else "training"
        raise ValueError(f"environment {self.name!r} drew no {split} example in {MAX_DRAWS} draws")

    def example(self, index: int) -> Example:
        return self._first_draw(index, index, held_out=False)

    def eval_example(self, number: int) -> Example:
        return self._first_draw(EVAL_STREAM_OFFSET + number, EVAL_STREAM_OFFSET + number, held_out=True)

    def corpus(self, num_examples: int) -> list[str]:
        """Text to train a tokenizer on: the first draw of each of the first indices, on either side of the split
        (a vocabulary is not training data, and the built-in tokenizer stays independent of the split)."""
        texts: list[str] = []
        for i in range(num_examples):
            texts += _texts(self.draw(i, self.rng(i)))
        return texts
