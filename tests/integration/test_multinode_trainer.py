"""A trainer job across two "machines" on loopback: the coordinator's node 0 and `prime-trainer node` as node 1.

The reduced demo run of test_orchestrator_network.py with `orchestrator.trainer_launch.nnodes = 2` and one rank per
node: the coordinator launches trainer node 0 (hosting torchrun's rendezvous on a fixed port),
and the test starts node 1 the way an operator would on a second machine. The run must finish
every step from accepted submissions, with each step trained by a world of 2 ranks (per-step
metrics in the ledger and both nodes' logs), and node 1 must exit cleanly with the run. A
second run SIGKILLs the coordinator mid-run: node 1, which has no coordinator PID to watch,
must stop by itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.ports import free_port
from tests.integration.test_orchestrator_network import (
    NUM_STEPS,
    REPO_ROOT,
    check_completed_run,
    finish,
    metric,
    start,
    wait_for,
    write_config,
)
from tests.support.network import ledger_rows

pytestmark = pytest.mark.slow


def start_second_node(root: Path, master_port: int) -> subprocess.Popen[bytes]:
    """`prime-trainer node` for node rank 1, once the coordinator has written the run's spec."""
    train_dir = root / "run" / "train"
    deadline = time.monotonic() + 120
    while not (train_dir / "service.json").is_file():
        assert time.monotonic() < deadline, "the coordinator never wrote the trainer spec"
        time.sleep(0.5)
    command = [
        str(Path(sys.executable).parent / "prime-trainer"),
        "node",
        "--train-dir",
        str(train_dir),
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
        "--nproc-per-node",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with (root / "node1.log").open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_two_trainer_nodes_train_every_step_as_one_world(tmp_path: Path) -> None:
    port, master_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    launch = {"nproc": 1, "nnodes": 2, "master_port": master_port}
    config_path = write_config(tmp_path, port, trainer_launch=launch)
    coordinator = start(tmp_path, config_path, url, "coordinator")
    node1 = start_second_node(tmp_path, master_port)
    try:
        rc = finish(coordinator, 600)
        node1_rc = node1.wait(timeout=60)
    finally:
        coordinator.stop()
        stop(node1)
    node1_log = (tmp_path / "node1.log").read_text()
    assert rc == 0, (tmp_path / "coordinator.log").read_text()[-4000:]
    assert node1_rc == 0, node1_log[-4000:]
    check_completed_run(tmp_path, (tmp_path / "coordinator.out").read_text())
    metrics = [json.loads(row[0]) for row in ledger_rows(tmp_path, "SELECT metrics_json FROM train_steps")]
    assert len(metrics) == NUM_STEPS and all(m["world_size"] == 2 for m in metrics), metrics
    trainer_log = (tmp_path / "run" / "train" / "trainer.log").read_text()
    assert "trainer service rank 0/2" in trainer_log and f"step {NUM_STEPS} trained by 2 ranks" in trainer_log
    assert "trainer service rank 1/2" in node1_log and "trainer service rank 1/2" not in trainer_log
    # Node 1 loaded v0 from the shared train dir, not from a path on the coordinator's machine.
    assert (tmp_path / "run" / "train" / "start_checkpoint" / "model.safetensors").is_file()


def test_the_second_node_stops_when_the_coordinator_is_killed(tmp_path: Path) -> None:
    port, master_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    launch = {"nproc": 1, "nnodes": 2, "master_port": master_port}
    config_path = write_config(tmp_path, port, local_network=False, trainer_launch=launch)
    coordinator = start(tmp_path, config_path, url, "coordinator")
    node1 = start_second_node(tmp_path, master_port)
    try:
        # No workers: the job comes up, both nodes join, and the ranks wait for step 1's batch.
        wait_for(lambda: "trainer service rank 1/2" in (tmp_path / "node1.log").read_text(), coordinator, 300)
        assert node1.poll() is None and metric(url, "prime_train_steps_done") in (0.0, None)
        coordinator.kill()
        node1_rc = node1.wait(timeout=60)
    finally:
        coordinator.stop()
        stop(node1)
    assert node1_rc != 0, "node 1 should fail once node 0 is gone"
    assert "the trainer job lost a peer" in (tmp_path / "node1.log").read_text()
