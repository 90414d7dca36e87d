"""Pure ledger rules: lease grants and fair share, staleness, policy choice, rollouts, seeds, bans, rate limits."""

from __future__ import annotations

import pytest

from coordinator.ledger.reputation import BanPolicy, ban_reason
from coordinator.ledger.scheduling import (
    choose_policy_version,
    fair_share,
    grant_count,
    oldest_allowed_version,
    rollout_problems,
    staleness_problem,
)
from coordinator.ledger.seeds import new_run_secret, sampling_seed
from coordinator.serving.ratelimit import RateLimiter
from protocol.schemas import Rollout, TurnRollout


@pytest.mark.parametrize(
    ("requested", "held", "per_node", "open_total", "cap", "live", "expected"),
    [
        (1, 0, 2, 0, 100, 1, 1),
        (5, 0, 2, 0, 100, 1, 2),  # per-node cap
        (5, 1, 2, 0, 100, 1, 1),
        (5, 2, 2, 0, 100, 1, 0),
        (5, 0, 8, 99, 100, 1, 1),  # network cap
        (5, 0, 8, 0, 10, 5, 2),  # fair share: 10 slots over 5 live workers
        (5, 3, 8, 3, 10, 5, 0),  # already over its share
        (5, 0, 8, 0, 10, 0, 5),  # nobody counted live yet: the asker is the only one
    ],
)
def test_grant_count(
    requested: int, held: int, per_node: int, open_total: int, cap: int, live: int, expected: int
) -> None:
    assert grant_count(requested, held, per_node, open_total, cap, live) == expected


def test_fair_share_is_at_least_one() -> None:
    assert fair_share(10, 1000) == 1
    assert fair_share(10, 3) == 4


def test_staleness() -> None:
    assert oldest_allowed_version(1, 2) == 0
    assert staleness_problem(5, 5, 0) is None
    assert staleness_problem(3, 5, 2) is None
    problem = staleness_problem(2, 5, 2)
    assert problem is not None and "oldest accepted is 3" in problem
    future = staleness_problem(6, 5, 2)
    assert future is not None and "not been published" in future


def test_choose_policy_version_prefers_the_newest_fresh_version_held() -> None:
    assert choose_policy_version(5, 2, [1, 3, 4]) == 4
    assert choose_policy_version(5, 2, [1, 2]) == 5  # nothing fresh enough held: current
    assert choose_policy_version(5, 2, []) == 5
    assert choose_policy_version(5, 2, [7]) == 5  # a version from the future is ignored


def rollout(prompt: int, sample: int, tokens: int = 2, logprobs: int | None = None) -> Rollout:
    return Rollout(
        prompt_index=prompt,
        sample_index=sample,
        completion_ids=[1] * tokens,
        logprobs=[0.0] * (tokens if logprobs is None else logprobs),
        finish_reason="length",
        proof_b64="",
    )


def test_rollout_problems() -> None:
    complete = [rollout(p, s) for p in (0, 1) for s in (0, 1)]
    assert rollout_problems(complete, [0, 1], 2, 4) == []
    assert "missing" in rollout_problems(complete[:3], [0, 1], 2, 4)[0]
    assert "appears twice" in rollout_problems([*complete, complete[0]], [0, 1], 2, 4)[0]
    assert "not part of this task" in rollout_problems([*complete[:3], rollout(0, 2)], [0, 1], 2, 4)[0]
    assert "logprobs for" in rollout_problems([*complete[:3], rollout(1, 1, logprobs=1)], [0, 1], 2, 4)[0]
    assert "exceed max_tokens" in rollout_problems([*complete[:3], rollout(1, 1, tokens=5)], [0, 1], 2, 4)[0]


def test_rollout_problems_at_the_door() -> None:
    """Claims no honest worker makes, checkable without the model: empty, logprob above 0, outside the vocabulary."""
    complete = [rollout(p, s) for p in (0, 1) for s in (0, 1)]
    assert rollout_problems(complete, [0, 1], 2, 4, vocab_size=2) == []  # token id 1, logprob 0.0: fine
    empty = [*complete[:3], rollout(1, 1, tokens=0)]
    assert rollout_problems(empty, [0, 1], 2, 4) == [
        "rollout 3: completion_ids is empty (at least one token is always drawn)"
    ]
    positive = [*complete[:3], complete[3].model_copy(update={"logprobs": [-1.0, 1e-3]})]
    assert rollout_problems(positive, [0, 1], 2, 4) == [
        "rollout 3: logprobs[1] is 0.001, above 0 (a log-probability is at most 0)"
    ]
    outside = [*complete[:3], complete[3].model_copy(update={"completion_ids": [1, 2]})]
    assert rollout_problems(outside, [0, 1], 2, 4) == []  # vocabulary unknown: left to the validators
    assert rollout_problems(outside, [0, 1], 2, 4, vocab_size=2) == [
        "rollout 3: completion_ids holds token id 2, outside the policy's vocabulary [0, 2)"
    ]


def test_later_turns_are_refused_in_a_single_turn_run_and_checked_like_the_first() -> None:
    complete = [rollout(p, s) for p in (0, 1) for s in (0, 1)]
    turn = TurnRollout(completion_ids=[1, 1], logprobs=[0.0, -1.0], finish_reason="stop", proof_b64="")
    episode = complete[3].model_copy(update={"later_turns": [turn, turn]})
    assert rollout_problems([*complete[:3], episode], [0, 1], 2, 4) == [
        "rollout 3: 3 policy turns, but this run's episodes have at most 1 (its environment is single-turn)"
    ]
    assert rollout_problems([*complete[:3], episode], [0, 1], 2, 4, vocab_size=2, max_turns=3) == []
    assert rollout_problems([*complete[:3], episode], [0, 1], 2, 4, max_turns=2) == [
        "rollout 3: 3 policy turns, but this run's episodes have at most 2"
    ]
    bad = TurnRollout(completion_ids=[1, 7, 1], logprobs=[0.5, 0.0], finish_reason="stop", proof_b64="")
    broken = complete[3].model_copy(update={"later_turns": [turn, bad]})
    assert rollout_problems([*complete[:3], broken], [0, 1], 2, 2, vocab_size=2, max_turns=3) == [
        "rollout 3 turn 2: 2 logprobs for 3 tokens",
        "rollout 3 turn 2: 3 tokens exceed max_tokens 2",
        "rollout 3 turn 2: logprobs[0] is 0.5, above 0 (a log-probability is at most 0)",
        "rollout 3 turn 2: completion_ids holds token id 7, outside the policy's vocabulary [0, 2)",
    ]


def test_seeds_depend_on_secret_task_group_and_lease() -> None:
    secret = new_run_secret()
    seed = sampling_seed(secret, "reverse_text", 7, "l-a")
    assert seed == sampling_seed(secret, "reverse_text", 7, "l-a")
    assert 0 <= seed < 2**63
    others = {sampling_seed(secret, "reverse_text", 8, "l-a"), sampling_seed(secret, "arithmetic", 7, "l-a")}
    others.add(sampling_seed(new_run_secret(), "reverse_text", 7, "l-a"))
    others.add(sampling_seed(secret, "reverse_text", 7, "l-b"))  # the same task re-issued: a fresh draw
    assert seed not in others and len(others) == 4
    assert sampling_seed("00" * 32, "t", 1, "l") != sampling_seed("00" * 32, "t1", 0, "l")  # no ambiguity from joining


def test_ban_reason() -> None:
    policy = BanPolicy(ban_after_rejections=3)
    assert ban_reason(policy, 10, 2, ["x"]) is None
    reason = ban_reason(policy, 10, 3, ["exponent mismatch"])
    assert reason is not None and "3 submissions rejected" in reason and "exponent mismatch" in reason


def test_rate_limiter_refills_and_bounds_keys() -> None:
    now = [0.0]
    limiter = RateLimiter(rate_per_s=2.0, burst=2, max_keys=2, clock=lambda: now[0])
    assert limiter.retry_after_s("a") is None
    assert limiter.retry_after_s("a") is None
    wait = limiter.retry_after_s("a")
    assert wait == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.retry_after_s("a") is None
    assert limiter.retry_after_s("b") is None
    limiter.retry_after_s("c")  # evicts the least recently used key
    assert len(limiter._buckets) == 2
