"""Prompts that rest: one whose groups carried no reward spread several times in a row sits out a while.

A prompt answered all right (or all wrong) by every sample of its group teaches nothing, and is likely to do so
again; where a run reads its prompts more than once (a finite dataset read again), generating for it again wastes
the workers' time. A prompt is known by its token ids (:func:`prompt_key`). Each time a step takes or sets aside a
group of it, :func:`after_group` counts the groups without signal in a row (a group with signal starts the count
over); at ``rest_after`` in a row the prompt rests: no new task holds it until ``rest_groups`` more tasks were
created (``resting_until``, a task's group index). Every rule reads the ledger alone, so every API process and
every restart decides alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

MAX_RESTING_SKIPS = 64
"""New tasks passed over in a row for holding a resting prompt before one is created anyway (a run whose prompts
all rest still leases)."""


def prompt_key(token_ids: Sequence[int]) -> str:
    """The identity of a prompt: a hash of its token ids."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()


@dataclass(frozen=True)
class PromptSignal:
    no_signal_in_a_row: int
    resting_until: int
    """The group index from which tasks may hold the prompt again (0: not resting)."""


def after_group(
    state: PromptSignal, signal: bool, next_group_index: int, rest_after: int, rest_groups: int
) -> PromptSignal:
    """A prompt's state after one more of its groups, taken when tasks up to ``next_group_index`` exist."""
    if signal or rest_after <= 0:
        return PromptSignal(0, state.resting_until)
    count = state.no_signal_in_a_row + 1
    if count >= rest_after:
        return PromptSignal(0, next_group_index + rest_groups)
    return PromptSignal(count, state.resting_until)
