"""The truncation rule: a completion cut at ``max_tokens`` without EOS earns no credit, unless the run says so.

A policy that learns to pad (keep writing until the token budget runs out) must not be paid for
it. Whether a completion was cut is read from its tokens, never from what a worker claims: it was
cut when its last token is not one of the end tokens (the trusted side's EOS ids). Under the run's
``truncated = "minimum"`` (the default, part of the ``[environment]`` section and so of the signed
run spec), a cut completion is still scored by the environment (its named rewards keep their
names and weights) and then :func:`no_credit` keeps only what would take reward away: every named
reward whose weighted term is positive scores 0, any whose term is negative (a penalty) is kept.
For environments whose rewards lie in [0, 1] (the built-in tasks, reasoning-gym) that is 0, the
lowest reward the environment gives. ``truncated = "score"`` scores a cut completion like any
other. :func:`completion_scores` is what every trusted scorer calls: the validator's reward
recomputation and the trainer's rollouts and evaluator.
"""

from __future__ import annotations

from collections.abc import Sequence

from environments.base import Environment, Example, Scores, finite_scores


def is_truncated(completion_ids: Sequence[int], eos_token_ids: Sequence[int]) -> bool:
    """Whether a completion was cut before its end: its last token is not an end token (or it has none)."""
    return not completion_ids or completion_ids[-1] not in set(eos_token_ids)


def no_credit(scores: Scores) -> Scores:
    """``scores`` with every reward that adds to the total set to 0 and every penalty kept."""
    return Scores(
        {name: value if scores.weights[name] * value < 0 else 0.0 for name, value in scores.rewards.items()},
        dict(scores.weights),
    )


def completion_scores(environment: Environment, example: Example, completion: str, truncated: bool) -> Scores:
    """The rewards of ``completion`` (decoded, EOS dropped) under the environment's truncation rule."""
    # checked before the rule: zeroing a NaN, inf or string would hide the environment's fault
    scores = finite_scores(environment.score(example, completion))
    if truncated and environment.truncated == "minimum":
        return no_credit(scores)
    return scores
