"""``reverse_text``: reverse a short string of letters; reward is the LCS ratio to the exact reversal.

The reward follows prime-rl's debug task: ``2 * LCS(completion, reversed) / (len(a) + len(b))``,
so partial reversals earn partial credit (the signal RL needs), and only the exact reversal
scores 1.0. Texts are 2-3 lowercase "words" drawn from the example's own generator. The answer
scored is the completion's first non-empty line (:func:`environments.answers.first_line`): text on later lines neither
earns nor costs credit, text after the answer on its line lowers the ratio.
"""

from __future__ import annotations

import random
import string

from environments.answers import first_line
from environments.base import Example, Scores, SeededEnvironment


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (O(len(a) * len(b)) DP)."""
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for char_a in a:
        current = [0]
        for j, char_b in enumerate(b):
            current.append(previous[j] + 1 if char_a == char_b else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def lcs_ratio(a: str, b: str) -> float:
    """``2 * LCS / (len(a) + len(b))`` in [0, 1]; 1.0 for two empty strings."""
    if not a and not b:
        return 1.0
    return 2.0 * lcs_length(a, b) / (len(a) + len(b))


class ReverseText(SeededEnvironment):
    name = "reverse_text"
    default_max_tokens = 32

    min_words = 2
    max_words = 3
    min_word_len = 2
    max_word_len = 5

    def draw(self, index: int, rng: random.Random) -> Example:
        num_words = rng.randint(self.min_words, self.max_words)
        lengths = [rng.randint(self.min_word_len, self.max_word_len) for _ in range(num_words)]
        words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(n)) for n in lengths]
        text = " ".join(words)
        return Example(index=index, prompt=f"reverse: {text}\n", answer=text[::-1])

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("lcs_ratio", lcs_ratio(first_line(completion), example.answer or ""))
