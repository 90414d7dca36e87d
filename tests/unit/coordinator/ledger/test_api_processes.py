"""API processes on one ledger: each counts the live ones and enforces its share of the rate limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.ledger.api_processes import STALE_ROUNDS, ApiProcesses
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.storage.engine import Database
from coordinator.serving.ratelimit import RateLimiter
from environments.prompts import NoPrompts
from tests.support.ledger_helpers import ledger_config


def test_processes_count_each_other_and_drop_the_gone(tmp_path: Path, ledger_url: str) -> None:
    database = Database(ledger_url)
    now = [1000.0]
    try:
        Ledger(database, ledger_config(tmp_path / "run", ledger_url), NoPrompts(), "coordinator")  # migrates
        first, second, killed = (ApiProcesses(database, 5.0, clock=lambda: now[0]) for _ in range(3))
        assert first.beat() == 1
        assert second.beat() == 2 and killed.beat() == 3
        now[0] += (STALE_ROUNDS - 1) * 5.0
        assert first.beat() == 3  # the killed one may still be alive: it keeps its place a while
        second.beat()
        now[0] += 2 * 5.0
        assert first.beat() == 2  # not renewed for STALE_ROUNDS rounds: gone
        second.leave()
        assert first.beat() == 1
    finally:
        database.dispose()


def test_a_limiter_enforces_its_share_of_rate_and_burst() -> None:
    now = [0.0]
    limiter = RateLimiter(rate_per_s=3.0, burst=30, clock=lambda: now[0])
    limiter.share = 1 / 3
    assert sum(limiter.retry_after_s("a") is None for _ in range(30)) == 10
    assert limiter.retry_after_s("a") == pytest.approx(1.0)  # one token per second: a third of the rate
    now[0] += 1.0
    assert limiter.retry_after_s("a") is None
    limiter.share = 1 / 100
    assert limiter.retry_after_s("b") is None  # a share below one request still lets one through


def test_a_process_takes_its_share_and_announces_only_with_others() -> None:
    from types import SimpleNamespace

    from coordinator.serving.app import _share_among

    limiter = RateLimiter(rate_per_s=3.0, burst=30)
    feed = SimpleNamespace(others=True)
    ledger = SimpleNamespace(feed=feed)
    _share_among(ledger, [limiter], 1)  # type: ignore[arg-type]
    alone = (limiter.share, feed.others)
    _share_among(ledger, [limiter], 3)  # type: ignore[arg-type]
    assert alone == (1.0, False) and limiter.share == pytest.approx(1 / 3) and feed.others is True
    _share_among(SimpleNamespace(feed=None), [limiter], 2)  # type: ignore[arg-type]  # SQLite: no feed
    assert limiter.share == 0.5
