"""One worker serving two LoRA runs on one base, through two real coordinators.

Two coordinators (two runs, two ledgers) publish the same base as v0 and each its own adapter as v1. One HF
`prime-worker join --also-join` registers with both, starts one engine on the base, and works for both runs
through one adapter per run; each run's validator recomputes with its own adapter and accepts the worker's
work at v1 in both runs. A worker that skips the adapter (generating with the base alone, proofs honest) is
rejected at v1. A worker asked to join a run on another base refuses in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol.identity import load_or_create_identity
from tests.support.lora import make_lora_adapter
from tests.support.network import BIN, REPO_ROOT, Network, running_network, tiny_policy
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow

LORA = {"orchestrator": {"trainer": {"lora": {"enabled": True, "rank": 4, "alpha": 8.0}}}}


def judged_v1(net: Network, node_id: str) -> list[dict[str, Any]]:
    """The verdicts of ``node_id``'s submissions at version 1 (adapter work), from the run's event log."""
    verdicts = net.verdicts()
    return [
        verdicts[event["subject"]]
        for event in net.events("submit")
        if event["data"].get("policy_version") == 1 and event["subject"] in verdicts and event["node_id"] == node_id
    ]


def start_base_only_worker(net: Network, name: str) -> str:
    """A worker of ``net`` that generates with the base alone (tests/support/base_only_worker.py); its id."""
    data_dir = net.root / name
    log = open(net.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    argv = [sys.executable, "-m", "tests.support.base_only_worker", net.url, str(data_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    net.workers.append(subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=REPO_ROOT))
    return load_or_create_identity(data_dir).node_id


def test_one_worker_serves_two_lora_runs_on_one_base(tmp_path: Path) -> None:
    base = tiny_policy(tmp_path / "base", seed=0)
    adapters = [make_lora_adapter(base, tmp_path / f"adapter-{run}", rank=4, seed=run + 1) for run in range(2)]
    for name in "abc":
        (tmp_path / name).mkdir()
    with (
        running_network(tmp_path / "a", checkpoints=[base, adapters[0]], sections=LORA) as run_a,
        running_network(tmp_path / "b", checkpoints=[base, adapters[1]], sections=LORA) as run_b,
    ):
        for net in (run_a, run_b):
            net.publish(1)
            net.start_validator()
        worker = run_a.start_worker("worker", "hf", [], "--also-join", run_b.url)
        honest = load_or_create_identity(tmp_path / "a" / "worker").node_id
        cheat = start_base_only_worker(run_b, "base-only")

        def adapter_work_judged() -> bool:
            assert worker.poll() is None, run_a.worker_log("worker")
            return all(judged_v1(net, honest) for net in (run_a, run_b)) and bool(judged_v1(run_b, cheat))

        wait_until(adapter_work_judged, 420, "adapter work judged in both runs")
        for net in (run_a, run_b):
            verdicts = [v for v in net.verdicts().values() if v["worker_id"] == honest]
            assert all(v["accepted"] for v in verdicts), [v["reasons"] for v in verdicts if not v["accepted"]]
        for verdict in judged_v1(run_b, cheat):  # the base alone, where the version is an adapter
            assert not verdict["accepted"], verdict
            assert any(": toploc:" in r or ": sampling" in r for r in verdict["reasons"]), verdict["reasons"]
        log = (tmp_path / "a" / "worker.log").read_text(errors="replace")
        lines = [json.loads(line)["event"] for line in log.splitlines() if line.startswith("{")]
        assert sum("engine(s) ready" in line for line in lines) == 1, lines  # one engine, one copy of the base
        assert sum(line.startswith("LoRA run (rank 4)") for line in lines) == 2
        assert (tmp_path / "a" / "worker" / "runs").is_dir()  # the second run's versions apart from the first's

        other_base = tiny_policy(tmp_path / "other-base", seed=5)
        with running_network(tmp_path / "c", checkpoints=[other_base], sections=LORA) as run_c:
            argv = [str(BIN / "prime-worker"), "join", "--coordinator", run_a.url, "--also-join", run_c.url]
            argv += ["--engine", "hf", "--gpu", "none", "--data-dir", str(tmp_path / "refused")]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 2, done.stderr[-3000:]
            assert "trains on another base" in done.stderr and "Traceback" not in done.stderr
