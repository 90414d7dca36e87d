"""When the validators' verdicts on one submission add up to a decision (the quorum rule).

Pure: the ledger stores one vote per (submission, validator) and asks :func:`decide` after
each. A submission is accepted when ``required`` validators accepted it with the same rewards
(rewards are recomputed deterministically from the task, so honest validators agree; two
reward lists agree when they have the same length and differ by at most
:data:`REWARD_TOLERANCE` each), and rejected when ``required`` validators rejected it. Votes
that agree with nobody leave the submission pending for further validators. An accepting vote
whose rewards could not be read back (``readable`` false) agrees with nobody. Votes that the run's
environment could not score the rollouts (``environment_error``) are neither: ``required`` of them
make an environment-error decision (the worker is not at fault), and they never count as rejections.
Once decided, :func:`agrees_with` says which votes went with the decision and which were outvoted
(each validator's record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

REWARD_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Vote:
    validator_id: str
    accepted: bool
    rewards: tuple[float, ...]
    reasons: tuple[str, ...]
    readable: bool = True
    """False for a stored vote whose rewards could not be read: as an acceptance it agrees with no vote."""
    reward_components: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """(reward name, per-rollout values) of the environment's named rewards."""
    environment_error: bool = False
    """The validator's environment could not score the rollouts: a vote that the worker is not at fault."""


@dataclass(frozen=True)
class Decision:
    accepted: bool
    votes: tuple[Vote, ...]
    """The agreeing votes that made the decision, oldest first."""
    environment_error: bool = False
    """The environment could not score the rollouts: nothing is accepted and the worker is not at fault."""

    @property
    def rewards(self) -> list[float]:
        return list(self.votes[0].rewards) if self.accepted else []

    @property
    def reward_components(self) -> dict[str, list[float]]:
        return {name: list(values) for name, values in self.votes[0].reward_components} if self.accepted else {}

    @property
    def reasons(self) -> list[str]:
        """Every distinct reason the agreeing validators gave, in order."""
        return list(dict.fromkeys(reason for vote in self.votes for reason in vote.reasons))


def rewards_agree(first: Sequence[float], second: Sequence[float]) -> bool:
    return len(first) == len(second) and all(abs(a - b) <= REWARD_TOLERANCE for a, b in zip(first, second, strict=True))


def decide(votes: Sequence[Vote], required: int) -> Decision | None:
    """The decision the votes (oldest first) make, or None while the submission stays pending."""
    unscorable = [vote for vote in votes if vote.environment_error]
    if len(unscorable) >= required:
        return Decision(False, tuple(unscorable[:required]), environment_error=True)
    rejecting = [vote for vote in votes if not vote.accepted and not vote.environment_error]
    if len(rejecting) >= required:
        return Decision(False, tuple(rejecting[:required]))
    accepting = [vote for vote in votes if vote.accepted and vote.readable]
    for vote in accepting:
        agreeing = [other for other in accepting if rewards_agree(vote.rewards, other.rewards)]
        if len(agreeing) >= required:
            return Decision(True, tuple(agreeing[:required]))
    return None


def agrees_with(vote: Vote, decision: Decision) -> bool:
    """True when ``vote`` went with ``decision``: the same accept flag and, for an acceptance, rewards that agree."""
    if vote.accepted != decision.accepted:
        return False
    return not decision.accepted or (vote.readable and rewards_agree(vote.rewards, decision.rewards))
