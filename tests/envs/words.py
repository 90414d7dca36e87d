"""A ``python``-adapter environment with two weighted rewards, and one whose reward is not deterministic."""

from __future__ import annotations

import random

from environments.base import Environment, Example, Scores


class KeywordEnvironment(Environment):
    """Example i asks to reverse a word (eval: other words); rewards ``exact`` (0.75), ``short`` (0.25, short)."""

    name = "keyword"
    default_max_tokens = 16

    def __init__(self, words: list[str] | None = None, limit: int = 8, eval_words: list[str] | None = None) -> None:
        self.words = words or ["abc", "dog", "cab", "bead", "faced"]
        self.eval_words = eval_words or ["gab", "hide", "deaf"]
        self.limit = limit

    def example(self, index: int) -> Example:
        word = self.words[index % len(self.words)]
        return Example(index=index, prompt=f"reverse: {word}\n", answer=word[::-1])

    def eval_example(self, number: int) -> Example:
        word = self.eval_words[number % len(self.eval_words)]
        return Example(index=-1 - number, prompt=f"reverse: {word}\n", answer=word[::-1])

    def score(self, example: Example, completion: str) -> Scores:
        text = completion.strip()
        return Scores(
            {"exact": float(text == example.answer), "short": float(len(text) <= self.limit)},
            {"exact": 0.75, "short": 0.25},
        )


class FlakyEnvironment(KeywordEnvironment):
    """Its ``luck`` reward is random: validators could never agree on it."""

    name = "flaky"

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("luck", random.random())


class FaultyEnvironment(KeywordEnvironment):
    """Scores like :class:`KeywordEnvironment`, but fails on completions longer than ``max_chars``: it raises
    ZeroDivisionError with terminal escapes in its message (``fault="raise"``) or returns a reward of NaN, inf or
    a string (``"nan"``, ``"inf"``, ``"text"``). The start-up probes are all shorter, so it passes the determinism
    check; a random policy's completions are longer, so a validator meets the fault on real work. ``max_chars``
    < 0 fails always."""

    name = "faulty"

    def __init__(self, fault: str = "raise", max_chars: int = 12) -> None:
        super().__init__()
        self.fault = fault
        self.max_chars = max_chars

    def score(self, example: Example, completion: str) -> Scores:
        if len(completion) <= self.max_chars:
            return super().score(example, completion)
        if self.fault == "raise":  # its message carries terminal escapes, as any text an environment makes may
            raise ZeroDivisionError("division by zero\x1b[2J\x1b[31m")
        scores = Scores.single("ratio", 0.0)
        bad = {"nan": float("nan"), "inf": float("inf"), "text": "many"}[self.fault]
        object.__setattr__(scores, "rewards", {"ratio": bad})  # past Scores' own checks, as a careless scorer may
        return scores


class LeakyEnvironment(KeywordEnvironment):
    """Its eval set is its training set: the base class's eval stream of the same five words."""

    name = "leaky"

    def eval_example(self, number: int) -> Example:
        return Environment.eval_example(self, number)
