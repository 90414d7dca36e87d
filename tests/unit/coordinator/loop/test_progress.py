"""The coordinator's console: how the newest batch's rollouts ended and the newest eval, on the progress line."""

from __future__ import annotations

import re

import pytest

from coordinator.ledger.train_steps import StepRecord
from coordinator.loop.runner import progress_line, reward_curve, rollout_fields
from tests.unit.coordinator.conftest import LedgerHarness


def test_progress_shows_length_stop_truncation_and_the_newest_eval() -> None:
    last = {"batch_completion_tokens_mean": 15.94, "batch_stop_fraction": 0.0, "batch_truncated_fraction": 1.0}
    assert rollout_fields(last, None) == "len 15.9  stop 0.00  trunc 1.00"
    newest_eval = (8, {"eval_accuracy": 0.125, "eval_reward_mean": 0.6})
    assert rollout_fields(last, newest_eval) == "len 15.9  stop 0.00  trunc 1.00  eval v8 acc 0.125 reward 0.600"
    assert rollout_fields({}, None) == "len -  stop -  trunc -"  # before the first step


def test_the_reward_curve_has_length_stop_and_eval_columns() -> None:
    metrics = {
        "batch_reward_mean": 0.5,
        "batch_staleness_mean": 1.0,
        "batch_num_samples": 16,
        "loss": 0.01,
        "batch_completion_tokens_mean": 12.0,
        "batch_stop_fraction": 0.25,
    }
    records = [
        StepRecord(1, "published", 0, [], metrics),
        StepRecord(2, "published", 0, [], {**metrics, "eval_accuracy": 0.375}),
    ]
    header, one, two = reward_curve(records).splitlines()
    assert header.split()[-4:] == ["length", "stop", "eval", "acc"]
    assert one.split()[-3:] == ["12.0", "0.25", "-"]
    assert two.split()[-3:] == ["12.0", "0.25", "0.375"]


@pytest.mark.anyio
async def test_the_progress_line_counts_the_live_workers_and_validators(harness: LedgerHarness) -> None:
    # waiting for a first batch, an operator sees whether anyone has joined
    waiting = progress_line(harness.config, harness.ledger, 3.0)
    assert "step 0/" in waiting and "  workers 0  validators 0  " in waiting, waiting
    clients = [await harness.worker(), await harness.worker(), await harness.validator()]
    line = progress_line(harness.config, harness.ledger, 4.0)
    assert re.search(r"policy v0  workers 2  validators 1  reward -  accepted 0", line), line
    for client in clients:
        await client.aclose()
