"""Reputation, the ban policy and probation: counts of accepted and rejected submissions per node.

Pure: the ledger keeps the counts and asks :func:`ban_reason` after every rejecting verdict.
A banned node's signed requests are answered 403 with the reason stored at ban time.

Probation makes work something an identity earns: a new one may hold
``new_identity_leases`` open leases, one more per accepted submission and one fewer per
rejected one (:func:`lease_allowance`), and until it is proven (:func:`on_probation`) its
unverified work counts against its source's probation budget, which all the keys of one
source share (see :mod:`coordinator.ledger.sources`).
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


def lease_allowance(policy: ProbationPolicy, num_accepted: int, num_rejected: int) -> int:
    """Open leases an identity has earned: grows with accepted work, shrinks with rejections, at least 1."""
    earned = policy.new_identity_leases + num_accepted - num_rejected
    return max(1, min(policy.max_leases_per_node, earned))


def on_probation(policy: ProbationPolicy, num_accepted: int, num_rejected: int) -> bool:
    """True while the identity's verified work does not yet vouch for it (its source's budget applies)."""
    return num_accepted - num_rejected < policy.proven_after_accepted
