"""``arithmetic``: add or subtract two integers; reward 1.0 for the exact answer, else 0.0."""

from __future__ import annotations

from environments.base import Example, Scores, SeededEnvironment


class Arithmetic(SeededEnvironment):
    name = "arithmetic"
    default_max_tokens = 8

    max_operand = 99

    def example(self, index: int) -> Example:
        rng = self.rng(index)
        left, right = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        if rng.random() < 0.5:
            return Example(index=index, prompt=f"{left}+{right}=", answer=str(left + right))
        return Example(index=index, prompt=f"{left}-{right}=", answer=str(left - right))

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", 1.0 if completion.strip() == example.answer else 0.0)
