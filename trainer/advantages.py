"""Group-relative advantages (GRPO): each sample's reward against its own group's mean.

Pure functions over floats. A group is the set of samples drawn for one prompt; its
advantages are ``r_i - mean(r)``, optionally divided by the group's standard deviation (the
original GRPO normalisation; off by default, since it inflates the weight of groups whose
rewards barely differ, a bias Dr. GRPO points out). A group whose rewards are all equal
carries no signal and gets zero advantages either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

STD_EPS = 1e-6


def group_advantages(rewards: Sequence[float], normalize_std: bool = False) -> list[float]:
    """Advantages of one group's rewards: mean-centred, optionally std-normalised (population std)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + STD_EPS) for c in centred]


def batch_advantages(rewards: Sequence[float], group_size: int, normalize_std: bool = False) -> list[float]:
    """Advantages of consecutive groups of ``group_size`` rewards (prompt-major order)."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        out.extend(group_advantages(rewards[start : start + group_size], normalize_std))
    return out
