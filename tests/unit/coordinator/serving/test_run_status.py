"""`prime-coordinator status`: what it prints of a run, and the step pace the ledger measures."""

from __future__ import annotations

import pytest
from sqlalchemy import insert
from typer.testing import CliRunner

from coordinator.ledger.storage.tables import train_steps
from coordinator.serving.run_status import describe_status, duration
from protocol.schemas import RunStatus
from tests.unit.coordinator.conftest import MakeHarness

pytestmark = pytest.mark.anyio


def status(**values: object) -> RunStatus:
    base: dict[str, object] = {
        "run_name": "r",
        "current_policy_version": 12,
        "async_level": 1,
        "num_workers_live": 3,
        "num_validators_live": 1,
        "num_tasks_open": 2,
        "num_submissions_pending": 4,
        "num_submissions_accepted": 90,
        "num_submissions_rejected": 10,
    }
    return RunStatus.model_validate({**base, **values})


def test_the_lines_say_step_eta_nodes_and_rejections() -> None:
    lines = describe_status(status(num_train_steps=60, num_train_steps_done=12, step_s=2.5))
    assert lines[0] == "run 'r': step 12/60, 2.5 s a step, about 2m00s to go; policy v12"
    assert "3 worker(s) and 1 validator(s) live" in lines[1]
    assert "90 accepted, 10 rejected (10.0%), 4 pending" in lines[2]
    ended = status(num_train_steps=60, num_train_steps_done=60, run_ended=True)
    assert "the run has ended" in describe_status(ended)[0]
    assert "no RL loop" in describe_status(status())[0]
    assert [duration(s) for s in (42, 185, 3725)] == ["42s", "3m05s", "1h02m"]


async def test_the_ledger_measures_the_pace_of_the_newest_steps(make_harness: MakeHarness) -> None:
    harness = make_harness(orchestrator__enabled=True, orchestrator__num_steps=60)
    client = harness.client()
    assert (await client.status()).step_s is None
    with harness.database.write() as conn:
        for step, at in [(1, 100.0), (2, 102.0), (3, 106.0)]:
            row = {"step": step, "state": "published", "min_policy_version": 0, "recorded_at": 0.0}
            conn.execute(insert(train_steps).values(**row, published_at=at))
    answer = await client.status()
    assert (answer.num_train_steps, answer.num_train_steps_done, answer.step_s) == (60, 3, 3.0)
    await client.aclose()


def test_status_against_nothing_is_one_line() -> None:
    from coordinator.cli import app

    result = CliRunner().invoke(app, ["status", "--coordinator", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach the coordinator at http://127.0.0.1:9" in result.output
