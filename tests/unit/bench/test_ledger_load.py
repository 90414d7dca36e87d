"""The ledger load bench's plan: heterogeneous workers that join, leave and crash, and its per-endpoint summary."""

from __future__ import annotations

import asyncio
import math

from bench.ledger_load import default_validators, lives, summarize
from bench.load_client import ENDPOINTS, Pool


def test_the_plan_churns_the_asked_share_at_heterogeneous_speeds() -> None:
    plan = lives(1000, period_s=10.0, churn=0.2, start=0.0, duration_s=60.0, seed=3)
    assert len(plan) == 1200  # 200 leave during the run and 200 more join
    leaving = [life for life in plan if math.isfinite(life.leave_at)]
    assert len(leaving) == 200 and sum(life.crashes for life in leaving) == 100
    assert all(life.join_at <= life.leave_at <= 60.0 for life in leaving)
    late = plan[1000:]
    assert all(10.0 <= life.join_at <= 60.0 for life in late)
    assert all(life.join_at <= 10.0 for life in plan[:1000])
    periods = [life.period_s for life in plan]
    assert min(periods) >= 2.5 and max(periods) <= 40.0 and len({round(p, 3) for p in periods}) > 100
    mean_rate = sum(1.0 / p for p in periods) / len(periods)
    assert 0.09 < mean_rate < 0.11  # period_s is the mean period: as many requests as equal workers would send


def test_the_summary_names_every_endpoint_and_its_errors() -> None:
    raw = {
        "elapsed_s": 10.0,
        "latencies_s": {name: [0.001 * i for i in range(1, 101)] for name in ENDPOINTS},
        "errors": {name: 0 for name in ENDPOINTS} | {"verdict": 2},
        "error_kinds": {"verdict: 409 conflict": 2},
    }
    summary = summarize(raw)
    assert set(summary["endpoints"]) == set(ENDPOINTS)
    assert summary["errors"] == 2 and summary["requests"] == 100 * len(ENDPOINTS)
    assert summary["endpoints"]["pending"]["p99_ms"] == 100.0


def test_validators_are_enough_for_the_submission_rate() -> None:
    assert default_validators(200, 10.0) == 4
    assert default_validators(1000, 10.0) == 10  # 100 submissions a second, 10 each
    assert default_validators(10_000, 60.0) == 17


def test_the_client_pool_serves_callers_in_the_order_they_asked() -> None:
    """A caller that gives a connection back and asks again at once goes behind those already waiting (with an
    asyncio.Queue it took the connection first, and heartbeats queued for seconds behind submits)."""

    async def scenario() -> list[str]:
        pool = Pool("127.0.0.1", 1, size=1)
        order: list[str] = []
        first = await pool._take()  # the only connection

        async def wait_for_it(name: str) -> None:
            conn = await pool._take()
            order.append(name)
            pool._give_back(conn)

        waiting = [asyncio.create_task(wait_for_it(name)) for name in ("heartbeat", "lease")]
        await asyncio.sleep(0)  # both are waiting now
        pool._give_back(first)
        again = asyncio.create_task(wait_for_it("submit"))  # asks right after giving back
        await asyncio.gather(*waiting, again)
        return order

    assert asyncio.run(scenario()) == ["heartbeat", "lease", "submit"]


def test_a_cancelled_waiter_does_not_lose_the_connection() -> None:
    async def scenario() -> bool:
        pool = Pool("127.0.0.1", 1, size=1)
        held = await pool._take()
        cancelled = asyncio.create_task(pool._take())
        await asyncio.sleep(0)
        cancelled.cancel()
        pool._give_back(held)
        await asyncio.gather(cancelled, return_exceptions=True)
        return await asyncio.wait_for(pool._take(), timeout=1.0) is held

    assert asyncio.run(scenario())
