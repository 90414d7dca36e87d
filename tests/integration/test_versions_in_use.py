"""A policy version in use survives newer ones: a worker whose engine starts slowly, in a real network.

While the worker's engine is still starting on policy v0 (held back until the test releases it,
as a cold vLLM start holds a worker for minutes), the coordinator publishes v1 to v5 and the
worker fetches each from gossip, more than its cache keeps. v0 stays on disk because the
starting engine pins it; the engine then starts, the worker leases a task of the newest version,
switches to it and submits, and only then is v0 pruned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.network import REPO_ROOT, Network, running_network, tiny_policy
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow
NEWEST = 5


def test_a_slowly_starting_engine_keeps_its_version_while_newer_ones_arrive(tmp_path: Path) -> None:
    checkpoints = [tiny_policy(tmp_path / f"policy-{v}", seed=v) for v in range(NEWEST + 1)]
    with running_network(tmp_path, checkpoints=checkpoints) as net:
        worker, policies, release = start_slow_worker(net, "worker-slow")

        def holds(version: int) -> bool:
            assert worker.poll() is None, net.worker_log("worker-slow")
            return (policies / f"v{version}").is_dir()

        wait_until(lambda: holds(0), 120, "the worker to download policy v0 and start its engine")
        for version in range(1, NEWEST + 1):
            net.publish(version)
        wait_until(lambda: holds(NEWEST), 120, f"the worker to fetch policy v{NEWEST} from gossip")
        assert holds(0), "policy v0 was pruned from under the starting engine"
        release.touch()

        def submitted(version: int) -> bool:
            assert worker.poll() is None, net.worker_log("worker-slow")
            return any(e["data"].get("policy_version") == version for e in net.events("submit"))

        wait_until(lambda: submitted(NEWEST), 240, f"the worker to submit under policy v{NEWEST}")
        wait_until(lambda: not holds(0), 30, "policy v0 to be pruned once no engine or task uses it")
        assert sorted(int(p.name[1:]) for p in policies.glob("v*")) == [NEWEST - 2, NEWEST - 1, NEWEST]


def start_slow_worker(net: Network, name: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    data_dir = net.root / name
    release = net.root / f"{name}.release"
    log = open(net.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    argv = [sys.executable, "-m", "tests.support.slow_worker", net.url, str(data_dir), str(release)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=REPO_ROOT)
    net.workers.append(proc)
    return proc, data_dir / "policies", release
