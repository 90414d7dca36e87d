"""Faults that are not the worker's, in a real network: a validator outlives them and each becomes a recorded outcome.

A coordinator, an honest `prime-worker join` and a `prime-validator run` on 127.0.0.1. With an
environment whose reward raises ZeroDivisionError, or returns NaN, on real completions (it passes
the start-up check), the validator stays up and each such group is closed as ``environment_error``
with the exception in one line: its task dropped, the worker neither rejected nor banned, the
count in ``/v1/stats``. With a submission still pending when the origin stops keeping its policy
version (no validator running meanwhile), the ledger expires it and re-issues its task, and a
validator started afterwards audits the rest instead of exiting.
"""

from __future__ import annotations

from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import pytest

from protocol.identity import load_or_create_identity
from tests.support.network import Network, running_network, tiny_policy
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow


def alive(net: Network, proc: Popen[bytes], name: str) -> None:
    assert proc.poll() is None, f"{name} exited with {proc.returncode}: {net.worker_log(name)}"


def node_row(net: Network, node_id: str) -> dict[str, Any]:
    nodes = httpx.get(f"{net.url}/v1/stats", params={"limit": 1000}, timeout=5).json()["nodes"]
    (row,) = [node for node in nodes if node["node_id"] == node_id]
    return dict(row)


@pytest.mark.parametrize(
    ("fault", "summary"),
    [
        ("raise", "ZeroDivisionError: division by zero\x1b[2J\x1b[31m"),
        ("nan", "reward 'ratio' is nan, not a finite number"),
    ],
)
def test_an_environment_that_cannot_score_is_recorded_and_the_validator_goes_on(
    tmp_path: Path, fault: str, summary: str
) -> None:
    section = {"type": "python", "target": "tests.envs.words:FaultyEnvironment", "args": {"fault": fault}}
    with running_network(tmp_path, environment=section) as net:
        net.start_worker("worker", "hf", [])
        validator = net.start_validator(json_logs=False)  # the operator's console
        worker_id = load_or_create_identity(net.root / "worker").node_id

        def two_unscorable() -> bool:
            alive(net, validator, "validator")
            return len([e for e in net.events("void") if e["data"]["status"] == "environment_error"]) >= 2

        wait_until(two_unscorable, 300, "two groups the environment cannot score")
        for event in net.events("void"):
            data = event["data"]
            assert (data["status"], data["task_state"]) == ("environment_error", "dropped")
            assert data["worker_id"] == worker_id
            (reason,) = data["reasons"]
            assert reason.startswith("environment: scoring rollout p") and reason.endswith(summary), reason
        assert not [v for v in net.verdicts().values() if not v["accepted"]], "no environment error is a rejection"
        row = node_row(net, worker_id)
        assert (row["num_rejected"], row["banned"]) == (0, False), row
        status = httpx.get(f"{net.url}/v1/stats", timeout=5).json()["status"]
        assert status["num_submissions_environment_error"] >= 2, status
        alive(net, validator, "validator")
        log = net.worker_log("validator")
        assert "environment error on s-" in log
        # the environment's text reaches the console escaped: it cannot clear or recolour the operator's terminal
        assert "\x1b" not in log and (fault != "raise" or "division by zero\\x1b[2J\\x1b[31m" in log), log[-2000:]


def test_a_submission_whose_version_the_origin_dropped_expires_and_validators_keep_running(tmp_path: Path) -> None:
    checkpoints = [tiny_policy(tmp_path / f"policy-{v}", seed=v) for v in range(3)]
    sections: dict[str, dict[str, Any]] = {"policy": {"keep_versions": 2, "patches_enabled": False}}
    with running_network(tmp_path, checkpoints=checkpoints, sections=sections) as net:
        worker = net.start_worker("worker", "hf", [])
        worker_id = load_or_create_identity(net.root / "worker").node_id

        def made_with_v0() -> list[str]:
            alive(net, worker, "worker")
            return [e["subject"] for e in net.events("submit") if e["data"]["policy_version"] == 0]

        wait_until(lambda: bool(made_with_v0()), 300, "a submission made with policy v0")
        net.publish(1)
        net.publish(2)  # the origin keeps v1 and v2: nobody can fetch v0 any more
        stale = set(made_with_v0())
        expired = {e["subject"]: e["data"] for e in net.events("void")}
        assert set(expired) == stale, (expired, stale)
        for data in expired.values():
            assert data["status"] == "expired" and data["task_state"] == "open"
            assert "policy v0 is no longer kept by the origin" in data["reasons"][0]

        validator = net.start_validator()

        def judged_a_newer_group() -> bool:
            alive(net, validator, "validator")
            return any(e["subject"] not in stale for e in net.events("verdict"))

        wait_until(judged_a_newer_group, 300, "a verdict on a group made with a kept version")
        assert not set(net.verdicts()) & stale, "a submission of a version gone was audited"
        row = node_row(net, worker_id)
        assert (row["num_rejected"], row["banned"]) == (0, False), row
        status = httpx.get(f"{net.url}/v1/stats", timeout=5).json()["status"]
        assert status["num_submissions_expired"] == len(stale), status
        alive(net, validator, "validator")
