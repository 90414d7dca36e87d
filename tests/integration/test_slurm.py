"""The SLURM launchers on a real single-node SLURM cluster (slurmctld + slurmd + munged, started by the test).

`prime-coordinator slurm` submits the reduced demo run of test_orchestrator_network.py
(coordinator, 2-rank trainer, an HF worker and a validator from `[local_network]`) with sbatch:
the job runs `srun` over its node, node 0 starts the coordinator, and the job must complete with
every step trained from accepted submissions. Then `prime-worker slurm` submits a job array of
two workers to a running coordinator: both array tasks get work accepted, each from its own data
dir (its own node id); `scancel` of one array task stops that worker cleanly, leaving none of its
leases active in the ledger. With CI=true a SLURM that cannot be installed or started fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protocol.identity import KEY_FILE_NAME, load_or_create_identity
from runtime.ports import free_port
from tests.integration.test_orchestrator_network import REPO_ROOT, check_completed_run, write_config
from tests.support.network import ledger_rows, running_network
from tests.support.requirements import missing
from tests.support.slurm_cluster import SlurmCluster, SlurmUnavailableError, slurm_cluster

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    try:
        with slurm_cluster(tmp_path_factory.mktemp("slurm")) as started:
            yield started
    except SlurmUnavailableError as exc:
        missing(f"SLURM is required in CI: {exc}", f"no SLURM here: {exc}")


def submit(cluster: SlurmCluster, *argv: str) -> str:
    """Run one of our `slurm` commands against ``cluster`` and return the job id it printed."""
    env = {**cluster.env(), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:3] == ["submitted", "batch", "job"], done.stdout
    return words[3]


def test_the_coordinator_job_runs_the_reduced_demo_to_completion(cluster: SlurmCluster, tmp_path: Path) -> None:
    config_path = write_config(tmp_path, free_port())
    job_id = submit(cluster, "prime-coordinator", "slurm", "-c", str(config_path))
    output = tmp_path / "run" / f"slurm-{job_id}.out"
    states = cluster.wait_job(job_id, FINISHED, 600)
    log = output.read_text(errors="replace") if output.exists() else "(no job output)"
    assert states == ["COMPLETED"], f"{states}\n{log[-4000:]}\n{cluster.log()}"
    assert f"prime-coordinator: job {job_id} on localhost, rendezvous on localhost" in log
    check_completed_run(tmp_path, log)
    train_log = (tmp_path / "run" / "train" / "trainer.log").read_text()
    assert "trainer service rank 1/2" in train_log


def accepted_by_node(root: Path) -> dict[str, int]:
    rows = ledger_rows(
        root,
        "SELECT l.node_id, COUNT(*) FROM submissions s JOIN leases l ON l.lease_id = s.lease_id "
        "WHERE s.status = 'accepted' GROUP BY l.node_id",
    )
    return {node_id: count for node_id, count in rows}


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    tails = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"{what} not within {timeout_s} s\n{tails}")


def test_a_worker_array_joins_a_running_coordinator_and_stops_cleanly(cluster: SlurmCluster, tmp_path: Path) -> None:
    with running_network(tmp_path) as net:
        net.start_validator()
        base = tmp_path / "workers"
        argv = ["prime-worker", "slurm", "--workers", "2", "--coordinator", net.url, "--engine", "hf"]
        job_id = submit(cluster, *argv, "--gpu", "none", "--data-dir", str(base), "--no-exclusive")
        logs = [base / f"slurm-{job_id}_{i}.out" for i in range(2)] + [tmp_path / "validator.log"]
        keys = [base / f"worker-{i}" / KEY_FILE_NAME for i in range(2)]
        wait_until(lambda: all(key.exists() for key in keys), "both array tasks started", 120, logs)
        nodes = [load_or_create_identity(base / f"worker-{i}").node_id for i in range(2)]
        assert nodes[0] != nodes[1], "two array tasks share a node key"

        def both_accepted() -> bool:
            accepted = accepted_by_node(tmp_path)
            return all(accepted.get(node, 0) > 0 for node in nodes)

        wait_until(both_accepted, "accepted work from both array tasks", 240, logs)
        cluster.run("scancel", f"{job_id}_1")
        cluster.wait_job(f"{job_id}_1", FINISHED, 90)
        leases = ledger_rows(tmp_path, f"SELECT state FROM leases WHERE node_id = '{nodes[1]}'")
        assert leases and all(state != "active" for (state,) in leases), leases
        worker_log = logs[1].read_text(errors="replace")
        assert "Traceback" not in worker_log, worker_log[-3000:]
        assert cluster.job_states(f"{job_id}_0") == ["RUNNING"]
        cluster.run("scancel", job_id)
        cluster.wait_job(job_id, FINISHED, 90)
