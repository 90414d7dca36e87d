"""The sbatch scripts of `prime-coordinator slurm` and `prime-worker slurm` (``--dry-run``), without a cluster.

The rendered scripts must be valid bash, carry the allocation the config asks for (one node per
trainer node, an array of one task per worker, requeueable), and run commands our own CLIs
accept: the coordinator's `start` on SLURM node 0 with the rendezvous on the allocation's first
host, `prime-trainer node` with the node id as node rank elsewhere, and `join` on a data dir per
array index. The real submission runs in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.cli import app as coordinator_app
from tests.support.cli_parse import parse_command
from worker.cli import app as worker_app

runner = CliRunner()
MULTINODE = ["--set", "orchestrator.trainer_launch.nnodes=3", "--set", "orchestrator.trainer_launch.master_port=29500"]


def dry_run(app: object, *argv: str) -> str:
    result = runner.invoke(app, [*argv, "--dry-run"])  # type: ignore[arg-type]
    assert result.exit_code == 0, result.output
    return result.stdout


SLURM_ENV = {"$SLURM_NODEID": "2", "$MASTER_ADDR": "node-a", "${SLURM_ARRAY_TASK_ID:-0}": "3"}


def command_line(script: str, marker: str) -> list[str]:
    """The command of the script line that runs ``marker`` (a console script) as argv, with SLURM's variables
    filled in as a node would see them (:data:`SLURM_ENV`)."""
    (line,) = [line for line in script.splitlines() if f"/{marker} " in line or line.startswith(f"exec {marker} ")]
    for name, value in SLURM_ENV.items():
        line = line.replace(name, value)
    argv = shlex.split(line.strip().removeprefix("exec "))
    return [Path(argv[0]).name, *argv[1:]]


def check_bash(script: str) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_coordinator_job_spans_the_trainer_nodes() -> None:
    script = dry_run(coordinator_app, "slurm", "-c", "configs/demo.toml", *MULTINODE, "-p", "gpu", "--time", "8:00:00")
    check_bash(script)
    header = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    expected = {"--nodes=3", "--exclusive", "--requeue", "--partition=gpu", "--time=8:00:00", "--open-mode=append"}
    assert expected <= set(header)
    assert "--job-name=prime-coordinator-demo" in header
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script
    assert "srun --nodes=3 --ntasks=3 --ntasks-per-node=1" in script
    start = command_line(script, "prime-coordinator")
    context = parse_command(start)
    assert context.params["config"] == Path("configs/demo.toml").resolve()
    assert 'orchestrator.trainer_launch.master_addr="node-a"' in context.params["sets"]
    node = parse_command(command_line(script, "prime-trainer"))
    assert node.params["nnodes"] == 3 and node.params["master_port"] == 29500
    assert node.params["train_dir"] == Path("runs/demo/train").resolve()
    assert (node.params["master_addr"], node.params["node_rank"]) == ("node-a", 2)


def test_the_worker_job_is_an_array_with_a_data_dir_per_task(tmp_path: Path) -> None:
    argv = ["slurm", "-n", "4", "--coordinator", "http://head:8000", "--relay", "http://relay:8100"]
    script = dry_run(worker_app, *argv, "--data-dir", str(tmp_path), "--sbatch-arg=--account=lab")
    check_bash(script)
    header = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert {"--array=0-3", "--nodes=1", "--exclusive", "--requeue", "--account=lab"} <= set(header)
    assert f"--output={tmp_path}/slurm-%A_%a.out" in header
    join = command_line(script, "prime-worker")
    context = parse_command(join)
    assert context.params["gpu"] == "all" and context.params["coordinator"] == "http://head:8000"
    assert context.params["relay"] == ["http://relay:8100"]
    assert context.params["data_dir"] == tmp_path / "worker-3"


@pytest.mark.parametrize(
    ("app", "argv", "message"),
    [
        (worker_app, ["slurm", "-n", "2", "--sbatch-arg", "account=lab"], "is not an sbatch option"),
        (worker_app, ["slurm", "-n", "2", "--gpu", "two"], "gpu must be"),
        (coordinator_app, ["slurm", "--set", "orchestrator.trainer_launch.nnodes=2"], "trainer_launch.master_port"),
    ],
)
def test_bad_input_is_refused_with_a_reason(app: object, argv: list[str], message: str) -> None:
    result = runner.invoke(app, [*argv, "--dry-run"])  # type: ignore[arg-type]
    assert result.exit_code != 0 and message in result.output, result.output


def test_submitting_without_sbatch_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = runner.invoke(worker_app, ["slurm", "-n", "1", "--data-dir", "/tmp/unused-prime-workers"])
    assert result.exit_code != 0 and "sbatch is not on PATH" in result.output, result.output
