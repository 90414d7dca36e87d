"""Reading the answer out of a completion, so that text after the answer earns no credit.

A completion is decoded text without EOS. The built-in tasks' answers are one line and reasoning-gym's
reference answers have a known number of lines, so the answer scored is the completion's first
non-empty lines, as many as the reference answer has (:func:`answer_lines`; one for the built-ins,
:func:`first_line`): whatever the policy writes on later lines neither earns nor costs credit. A
completion that keeps writing until ``max_tokens`` is handled by the truncation rule
(:mod:`environments.truncation`).
"""

from __future__ import annotations


def answer_lines(completion: str, num_lines: int) -> str:
    """The first ``num_lines`` lines of ``completion`` after leading blank lines, each stripped, rejoined."""
    lines = completion.strip().split("\n")[: max(num_lines, 1)]
    return "\n".join(line.strip() for line in lines)


def first_line(completion: str) -> str:
    """The answer of a one-line task: the first non-empty line of ``completion``, stripped."""
    return answer_lines(completion, 1)
