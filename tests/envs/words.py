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


class LeakyEnvironment(KeywordEnvironment):
    """Its eval set is its training set: the base class's eval stream of the same five words."""

    name = "leaky"

    def eval_example(self, number: int) -> Example:
        return Environment.eval_example(self, number)
