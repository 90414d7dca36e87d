"""Reputation, the ban policy and probation: counts of accepted and rejected submissions per node.

Pure: the ledger keeps the counts and asks :func:`ban_reason` after every rejecting verdict.
A banned node's signed requests are answered 403 with the reason stored at ban time.

Probation makes work something an identity earns: a new one may hold
``new_identity_leases`` open leases, one more per accepted submission and one fewer per
rejected one or lease it let expire unsubmitted or abandoned (:func:`lease_allowance`), and until
it is proven (:func:`on_probation`) its unverified work counts against its source's probation
budget, which all the keys of one source share (see :mod:`coordinator.ledger.sources`).

Validators have a record too: how many of their votes agreed with the decision and how many were
outvoted; :func:`validator_flagged` says when that record is bad enough to hand the validator
fewer submissions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BanPolicy:
    ban_after_rejections: int
    """A node whose submissions were rejected this many times is banned."""


def ban_reason(policy: BanPolicy, num_accepted: int, num_rejected: int, last_reasons: list[str]) -> str | None:
    """Why the node is banned now, or None when it may go on."""
    if num_rejected < policy.ban_after_rejections:
        return None
    last = "; ".join(last_reasons)[:300] or "no reason given"
    return (
        f"{num_rejected} submissions rejected by validators (limit {policy.ban_after_rejections}, "
        f"{num_accepted} accepted); last rejection: {last}"
    )


@dataclass(frozen=True)
class ProbationPolicy:
    new_identity_leases: int
    """Open leases an identity with no verdicts may hold."""
    max_leases_per_node: int
    """The most open leases any identity may hold, however much it earned."""
    proven_after_accepted: int
    """An identity is on probation until its accepted submissions exceed its rejected ones by this many."""


def lease_allowance(policy: ProbationPolicy, num_accepted: int, num_rejected: int, num_forfeited: int = 0) -> int:
    """Open leases an identity has earned: grows with accepted work, shrinks with rejections and with leases it
    let expire unsubmitted or abandoned (``num_forfeited``), at least 1."""
    earned = policy.new_identity_leases + num_accepted - num_rejected - num_forfeited
    return max(1, min(policy.max_leases_per_node, earned))


def on_probation(policy: ProbationPolicy, num_accepted: int, num_rejected: int) -> bool:
    """True while the identity's verified work does not yet vouch for it (its source's budget applies)."""
    return num_accepted - num_rejected < policy.proven_after_accepted


@dataclass(frozen=True)
class ValidatorRecordPolicy:
    flag_after_outvoted: int
    """Outvoted votes a validator may have before it can be flagged."""
    max_outvoted_fraction: float
    """Share of its decided votes that may disagree with the decision before it is flagged."""


def validator_flagged(policy: ValidatorRecordPolicy, num_agreed: int, num_outvoted: int) -> bool:
    """True when the validator keeps voting against the decisions: at least ``flag_after_outvoted`` outvoted
    votes, and more than ``max_outvoted_fraction`` of its decided votes."""
    decided = num_agreed + num_outvoted
    return num_outvoted >= policy.flag_after_outvoted and num_outvoted > policy.max_outvoted_fraction * decided
