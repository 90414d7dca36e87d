"""``arithmetic``: add or subtract two integers; reward 1.0 for the exact answer, else 0.0.

The answer is the completion's first non-empty line, stripped: text on later lines neither earns
nor costs credit (a completion that pads until ``max_tokens`` is handled by the truncation rule).
"""

from __future__ import annotations

import random

from environments.answers import first_line
from environments.base import Example, Scores, SeededEnvironment


class Arithmetic(SeededEnvironment):
    name = "arithmetic"
    default_max_tokens = 8

    max_operand = 99

    def draw(self, index: int, rng: random.Random) -> Example:
        left, right = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        if rng.random() < 0.5:
            return Example(index=index, prompt=f"{left}+{right}=", answer=str(left + right))
        return Example(index=index, prompt=f"{left}-{right}=", answer=str(left - right))

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", 1.0 if first_line(completion) == example.answer else 0.0)
