"""Relay scoring: throughput-weighted choice, cool-downs after failures, bans after corruption."""

from __future__ import annotations

import random
from collections import Counter

from shardcast.client.scoring import Scoreboard


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_faster_source_gets_most_of_the_work() -> None:
    board = Scoreboard(["fast", "slow"], rng=random.Random(0))
    board.record("fast", "ok", num_bytes=900, seconds=1.0)
    board.record("slow", "ok", num_bytes=100, seconds=1.0)
    picks = Counter(board.choose() for _ in range(2000))
    assert 0.85 < picks["fast"] / 2000 < 0.95


def test_unmeasured_source_is_tried_optimistically() -> None:
    board = Scoreboard(["measured", "new"])
    board.record("measured", "ok", num_bytes=1000, seconds=1.0)
    assert board.weight("new") == board.weight("measured")


def test_in_flight_spreads_load() -> None:
    board = Scoreboard(["a", "b"])
    board.started("a")
    board.started("a")
    assert board.weight("b") == 3 * board.weight("a")


def test_network_failures_cool_down_then_recover() -> None:
    clock = FakeClock()
    board = Scoreboard(["a", "b"], backoff_base_s=1.0, backoff_max_s=4.0, clock=clock)
    board.record("a", "network", error="refused")
    assert board.choose() == "b"
    assert board.next_ready_in(exclude=["b"]) == 1.0
    board.record("a", "network")
    board.record("a", "network")
    board.record("a", "network")
    assert board.sources["a"].cooldown_until == clock.now + 4.0  # capped
    clock.now += 4.0
    assert board.choose(exclude=["b"]) == "a"
    board.record("a", "ok", num_bytes=10, seconds=1.0)
    assert board.sources["a"].consecutive_failures == 0


def test_corruption_bans_and_not_ready_costs_nothing() -> None:
    clock = FakeClock()
    board = Scoreboard(["evil", "good"], clock=clock, ban_s=60.0)
    board.record("good", "not_ready")
    assert board.sources["good"].num_failures == 0
    board.record("evil", "integrity", error="hash mismatch")
    assert board.is_banned("evil")
    assert all(board.choose() == "good" for _ in range(50))
    assert board.usable() == ["good"]
    assert board.next_ready_in(exclude=["good"]) is None
    clock.now += 61
    assert not board.is_banned("evil")
    assert board.snapshot()[0]["last_error"] == "hash mismatch"


def test_a_slow_source_is_demoted_below_healthy_ones_and_a_lost_hedge_costs_nothing() -> None:
    clock = FakeClock()
    board = Scoreboard(["trickle", "healthy"], clock=clock, rng=random.Random(0))
    board.record("healthy", "ok", num_bytes=10_000_000, seconds=1.0)
    board.started("trickle")
    board.record("trickle", "slow", num_bytes=3, seconds=3.0, error="outrun")
    assert board.sources["trickle"].throughput_bps == 1.0
    assert board.choose() == "healthy"  # cooling down
    clock.now += 60
    picks = Counter(board.choose() for _ in range(1000))
    assert picks["healthy"] > 990
    board.started("healthy")
    board.record("healthy", "cancelled")
    assert board.sources["healthy"].num_failures == 0 and board.sources["healthy"].in_flight == 0


def test_a_second_body_cut_short_bans_the_source() -> None:
    clock = FakeClock()
    board = Scoreboard(["cutter", "ok"], clock=clock)
    board.record("cutter", "short", num_bytes=10, seconds=0.1)
    assert not board.is_banned("cutter")  # one broken-off body may be the network's fault
    board.record("cutter", "ok", num_bytes=100, seconds=0.1)
    board.record("cutter", "short", num_bytes=10, seconds=0.1)
    assert board.is_banned("cutter") and board.usable() == ["ok"]
