"""Reputation and the ban policy: counts of accepted and rejected submissions per node.

Pure: the ledger keeps the counts and asks :func:`ban_reason` after every rejecting verdict.
A banned node's signed requests are answered 403 with the reason stored at ban time.
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
