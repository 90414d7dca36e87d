"""``sort_digits``: sort five digits in ascending order; reward 1.0 for the exact sorted list, else 0.0.

The default task of the demo and of the learning bench: a small model learns it in a few hundred
SFT steps, so an early stop leaves a start that is right on some held-out examples and not on
most, and RL raises the exact-answer rate. There are 10^5 inputs, so the held-out split
(:mod:`environments.held_out`) keeps thousands no training index can produce. The answer is the
completion's first non-empty line, stripped (:func:`environments.answers.first_line`): text on
later lines neither earns nor costs credit, and a completion cut at ``max_tokens`` earns nothing
under the default truncation rule (:mod:`environments.truncation`).
"""

from __future__ import annotations

import random

from environments.answers import first_line
from environments.base import Example, Scores, SeededEnvironment


class SortDigits(SeededEnvironment):
    name = "sort_digits"
    default_max_tokens = 16

    num_digits = 5

    def draw(self, index: int, rng: random.Random) -> Example:
        digits = [rng.randint(0, 9) for _ in range(self.num_digits)]
        prompt = "sort " + " ".join(map(str, digits)) + "="
        return Example(index=index, prompt=prompt, answer=" ".join(map(str, sorted(digits))))

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", 1.0 if first_line(completion) == example.answer else 0.0)
