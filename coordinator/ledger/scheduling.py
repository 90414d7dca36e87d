"""Pure scheduling rules of the ledger: how many tasks a worker gets, which policy version, what is stale.

No sockets, no database: the ledger calls these with numbers it read inside one transaction,
so the rules can be unit-tested on their own. The life of a lease is a small state machine::

    active --submit--> submitted
    active --abandon--> abandoned          (task re-queued at once)
    active --deadline passes--> expired    (task re-queued; a late submit is accepted only
                                            while nobody else holds the task)
    active --policy moves past it--> expired (a result would be stale anyway)

and the task a lease is for goes ``open -> leased -> submitted -> accepted``, falling back to
``open`` on expiry, abandonment or a rejecting verdict. Only ``accepted`` is final, and a task
reaches it once: the accepted set is keyed by task id.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from protocol.schemas import Rollout, TurnRollout


def fair_share(max_open_leases: int, num_live_sources: int) -> int:
    """Open leases one source may hold when the network is at capacity: an equal share, at least 1."""
    return max(1, math.ceil(max_open_leases / max(1, num_live_sources)))


def grant_count(
    requested: int,
    held_by_node: int,
    node_cap: int,
    open_leases_total: int,
    max_open_leases: int,
    num_live_sources: int,
    held_by_source: int | None = None,
    probation_room: int | None = None,
) -> int:
    """How many new leases a worker gets now (0 means: come back later).

    Bounded by what it asked for, its own cap (``node_cap``: the per-node limit or what it has
    earned so far), the network-wide cap, its source's fair share of the network-wide cap (all
    keys of one source share it; ``held_by_source`` None: the node is a source of its own) and,
    for an identity on probation, the room left in its source's probation budget.
    """
    held_by_source = held_by_node if held_by_source is None else held_by_source
    rooms = [
        requested,
        node_cap - held_by_node,
        fair_share(max_open_leases, num_live_sources) - held_by_source,
        max_open_leases - open_leases_total,
    ]
    if probation_room is not None:
        rooms.append(probation_room)
    return max(0, min(rooms))


def probation_pool_size(max_open_leases: int, probation_share: float) -> int:
    """Open leases all identities on probation may hold together: ``probation_share`` of the cap, at least 1."""
    return max(1, math.ceil(max_open_leases * probation_share))


def probation_pool_room(
    pool_size: int, held_in_pool: int, num_live_sources: int, held_by_source: int, forfeited_recently: bool
) -> int:
    """More probation leases one source may take now from the network-wide probation pool.

    Each live source may hold an equal part of the pool (at least one lease). A source that recently let a
    probation lease expire unsubmitted or abandoned it (hoarding) may take leases only while the pool is less
    than half full, so the other half turns over to sources without that record, such as honest newcomers.
    """
    usable = pool_size // 2 if forfeited_recently else pool_size
    return max(0, min(usable - held_in_pool, fair_share(pool_size, num_live_sources) - held_by_source))


def probation_deadline(issued_at: float, now: float, lease_ttl_s: float, probation_lease_max_s: float) -> float:
    """The deadline of a probation lease issued at ``issued_at`` and (re)newed at ``now``: a lease TTL from now,
    but never later than ``probation_lease_max_s`` after it was issued."""
    return min(now + lease_ttl_s, issued_at + probation_lease_max_s)


def oldest_allowed_version(current_version: int, async_level: int, floor: int = 0) -> int:
    """The oldest policy version whose results are still accepted: current - k, and never below ``floor`` (the
    version a rollback restored: the versions it undid are never trained) nor 0."""
    return max(0, current_version - async_level, floor)


def staleness_problem(policy_version: int, current_version: int, async_level: int, floor: int = 0) -> str | None:
    """Why a result made with ``policy_version`` cannot be accepted now, or None when it can."""
    if policy_version > current_version:
        return f"policy version {policy_version} has not been published yet (current is {current_version})"
    oldest = oldest_allowed_version(current_version, async_level, floor)
    if policy_version < oldest:
        return (
            f"policy version {policy_version} is stale: current is {current_version} and async_level is "
            f"{async_level}, so the oldest accepted is {oldest}; download the current policy and lease again"
        )
    return None


def choose_policy_version(current_version: int, async_level: int, versions_held: Iterable[int], floor: int = 0) -> int:
    """The version a leased task is to be generated with.

    The newest version the worker already holds, if it is still fresh enough (and not one a rollback undid), so a
    worker keeps generating while it downloads the next one (the asynchrony the design is about); otherwise the
    current version, which it must fetch first.
    """
    oldest = oldest_allowed_version(current_version, async_level, floor)
    usable = [version for version in versions_held if oldest <= version <= current_version]
    return max(usable) if usable else current_version


def rollout_problems(
    rollouts: Sequence[Rollout],
    prompt_indices: Sequence[int],
    group_size: int,
    max_tokens: int,
    vocab_size: int | None = None,
    max_turns: int = 1,
) -> list[str]:
    """What is wrong with a submitted group that no honest worker sends, checkable without the model.

    Every (prompt, sample) exactly once; at most ``max_turns`` policy turns per rollout (1: the run's environment
    is single-turn); per turn at least one and at most ``max_tokens`` tokens, one logprob per token, no logprob
    above 0 (a probability above 1) and, when the policy's ``vocab_size`` is known, no token id outside its
    vocabulary. The wire schema has already refused non-finite and absurd numbers; the validators check the rest
    with the model.
    """
    problems: list[str] = []
    expected = {(prompt, sample) for prompt in prompt_indices for sample in range(group_size)}
    seen: set[tuple[int, int]] = set()
    for number, rollout in enumerate(rollouts):
        key = (rollout.prompt_index, rollout.sample_index)
        if key not in expected:
            problems.append(
                f"rollout {number}: (prompt {key[0]}, sample {key[1]}) is not part of this task "
                f"(prompts {list(prompt_indices)}, group size {group_size})"
            )
        elif key in seen:
            problems.append(f"rollout {number}: (prompt {key[0]}, sample {key[1]}) appears twice")
        seen.add(key)
        turns = [rollout, *rollout.later_turns]
        if len(turns) > max_turns:
            problems.append(
                f"rollout {number}: {len(turns)} policy turns, but this run's episodes have at most {max_turns}"
                + (" (its environment is single-turn)" if max_turns == 1 else "")
            )
            continue
        for turn_number, turn in enumerate(turns):
            where = f"rollout {number}" + (f" turn {turn_number}" if len(turns) > 1 else "")
            problems += _turn_problems(turn, where, max_tokens, vocab_size)
    missing = expected - seen
    if missing:
        problems.append(f"{len(missing)} of {len(expected)} samples missing, e.g. (prompt, sample) {min(missing)}")
    return problems


def _turn_problems(turn: TurnRollout, where: str, max_tokens: int, vocab_size: int | None) -> list[str]:
    problems: list[str] = []
    if len(turn.logprobs) != len(turn.completion_ids):
        problems.append(f"{where}: {len(turn.logprobs)} logprobs for {len(turn.completion_ids)} tokens")
    if not turn.completion_ids:
        problems.append(f"{where}: completion_ids is empty (at least one token is always drawn)")
    if len(turn.completion_ids) > max_tokens:
        problems.append(f"{where}: {len(turn.completion_ids)} tokens exceed max_tokens {max_tokens}")
    positive = next((i for i, logprob in enumerate(turn.logprobs) if logprob > 0), None)
    if positive is not None:
        problems.append(
            f"{where}: logprobs[{positive}] is {turn.logprobs[positive]:g}, above 0 (a log-probability is at most 0)"
        )
    if vocab_size is not None:
        outside = next((token for token in turn.completion_ids if token >= vocab_size), None)
        if outside is not None:
            problems.append(
                f"{where}: completion_ids holds token id {outside}, outside the policy's vocabulary [0, {vocab_size})"
            )
    return problems


def lease_room(async_level: int, groups_per_step: int, groups_in_flight: int, steps_ahead: int | None = None) -> int:
    """How many more tasks may be leased now, when the orchestrator trains on what is generated.

    ``groups_in_flight`` counts groups leased, pending or accepted at a version still usable
    (>= current - k) and not yet trained on. With k = 0 (on-policy) the next step is built only
    from the current version, so one step's worth is leased per version (groups already in the
    step being trained count too), and further leases wait for the next version; a rejected or
    expired group frees its place. With k >= 1 generation never waits for training: it runs up
    to k + 1 steps' worth ahead of it, all of which the next steps can still use; generating
    more would only make groups that are stale before a step can take them (for instance while
    validators fall behind). ``steps_ahead`` lowers that window: with 1, the next step's groups
    are generated while the current step trains and nothing more, so no group goes stale unused
    (what a network whose workers share the trainer's machine wants); it never raises it.
    """
    window = async_level + 1 if steps_ahead is None else max(1, min(steps_ahead, async_level + 1))
    return max(0, groups_per_step * window - groups_in_flight)
