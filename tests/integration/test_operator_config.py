"""The operator's path trains: `prime-coordinator start -c configs/coordinator.toml` with a worker joining.

The config file is used as shipped (PostgreSQL ledger, built-in environment, built-in validator,
the RL loop on); the command line changes only what a test must: the data dir, loopback
addresses and free ports, the ledger URL (a scratch database on the test PostgreSQL) and a
small number of steps. One HF worker joins with `prime-worker join`; the coordinator trains the
steps, publishes a policy per step and exits by itself.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from runtime.children import stop_processes
from runtime.ports import free_port
from shardcast.format.store import VersionStore
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import scratch_postgres_database
from tests.support.network import BIN, REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
NUM_STEPS = 2


@pytest.mark.timeout(1800)
def test_the_shipped_coordinator_config_trains_with_a_joining_worker(tmp_path: Path, postgres_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(REPO_ROOT)}
    with scratch_postgres_database(postgres_url) as ledger_url:
        coordinator = CoordinatorProcess(REPO_ROOT / "configs" / "coordinator.toml", tmp_path / "coordinator.log", env)
        overrides: tuple[str, ...] = ("--data-dir", str(run_dir), "--host", "127.0.0.1", "--port", str(port))
        overrides += ("--ledger-url", ledger_url, "--set", "p2p.host='127.0.0.1'", "--set", "p2p.port=0")
        overrides += ("--set", f"orchestrator.num_steps={NUM_STEPS}")
        workers: list[subprocess.Popen[bytes]] = []
        try:
            coordinator.start(url, overrides, timeout_s=900)  # the first use builds the start checkpoint
            argv = [str(BIN / "prime-worker"), "join", "--coordinator", url, "--engine", "hf", "--gpu", "none"]
            argv += ["--data-dir", str(tmp_path / "worker"), "--json-logs"]
            with (tmp_path / "worker.log").open("ab") as log:
                workers.append(subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ, **env}))
            assert coordinator.proc is not None
            try:
                code = coordinator.proc.wait(timeout=900)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"no {NUM_STEPS} steps trained in time:\n{(tmp_path / 'coordinator.log').read_text()[-3000:]}"
                )
            assert code == 0, (tmp_path / "coordinator.log").read_text()[-3000:]
        finally:
            stop_processes(workers)
            coordinator.stop()
    published = VersionStore(run_dir / "policies").versions()
    assert NUM_STEPS in published, f"policies published: {published}"
