"""One run, one owner, through the real `prime-coordinator` and `prime-worker` commands.

A second coordinator on the same data dir, or on the same ledger from another data dir, is refused in one
line naming the holder; a coordinator whose data dir was moved away (a new key) is refused the old run's
ledger instead of resuming it with versions nobody trusts; `prime-coordinator reset` starts the run over on
SQLite and PostgreSQL; a second worker on one data dir is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomli_w

from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import new_postgres_schema, scratch_postgres_database

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared-ledger.db'}"  # outside both data dirs: only the ledger lock can tell
        return
    with scratch_postgres_database(request.getfixturevalue("postgres_url")) as database_url:
        yield new_postgres_schema(database_url)


def write_config(tmp_path: Path, name: str, data_dir: Path, ledger_url: str, port: int) -> Path:
    config = {
        "run_name": "owned",
        "data_dir": str(data_dir),
        "api": {"host": "127.0.0.1", "port": port},
        "ledger": {"url": ledger_url},
        "validation": {"builtin_enabled": False},
    }
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def coordinator_command(*args: str) -> subprocess.CompletedProcess[str]:
    """`prime-coordinator ARGS...`, run to its end."""
    return subprocess.run([str(BIN / "prime-coordinator"), *args], capture_output=True, text=True, env=ENV, timeout=120)


def start_refused(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return coordinator_command("start", "-c", str(config), *args)


@pytest.mark.slow
def test_one_coordinator_per_run_and_starting_over(tmp_path: Path, ledger_url: str) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path, "run", run_dir, ledger_url, port)
    first = CoordinatorProcess(config, tmp_path / "first.log", {"PYTHONPATH": str(REPO_ROOT)})
    try:
        first.start(url, timeout_s=180)
        signer = httpx.get(f"{url}/v1/policy-versions/latest", timeout=5).json()["signer"]

        # the same data dir on another port: the data dir lock names the holder
        same_dir = start_refused(config, "--port", str(free_port()))
        assert same_dir.returncode != 0
        assert f"the data dir {run_dir} is in use by prime-coordinator (pid {first.pid}" in same_dir.stderr
        assert len(same_dir.stderr.strip().splitlines()) == 1, same_dir.stderr

        # another data dir on the same ledger: the ledger lock names the holder
        other = write_config(tmp_path, "other", tmp_path / "other-run", ledger_url, free_port())
        same_ledger = start_refused(other)
        assert same_ledger.returncode != 0
        assert "is in use by prime-coordinator" in same_ledger.stderr, same_ledger.stderr
        assert f"pid {first.pid}" in same_ledger.stderr
    finally:
        first.stop()

    # the data dir moved away: a new key would resume the old run's ledger; refused, pointing at reset
    shutil.move(run_dir, tmp_path / "run-moved")
    moved = start_refused(config)
    assert moved.returncode != 0
    assert f"signed by coordinator {signer}" in moved.stderr and "prime-coordinator reset" in moved.stderr

    # starting over: reset drops the ledger (and the data dir); the next start is a fresh run at v0
    reset = coordinator_command("reset", "-c", str(config), "--yes")
    assert reset.returncode == 0, reset.stderr
    again = CoordinatorProcess(config, tmp_path / "again.log", {"PYTHONPATH": str(REPO_ROOT)})
    try:
        again.start(url, timeout_s=180)
        latest = httpx.get(f"{url}/v1/policy-versions/latest", timeout=5).json()
        assert latest["signer"] != signer and latest["manifest"]["version"] == 0
        assert httpx.get(f"{url}/v1/status", timeout=5).json()["num_submissions_accepted"] == 0
        shown = coordinator_command("status", "-c", str(config))
        assert shown.returncode == 0 and "run 'owned': no RL loop" in shown.stdout, shown.stderr
        # reset refuses while the run is served
        busy = coordinator_command("reset", "-c", str(config), "--yes")
        assert busy.returncode != 0 and "is in use by prime-coordinator" in busy.stderr
    finally:
        again.stop()


NODE_COMMANDS = {
    "prime-worker": ["join", "--coordinator", "http://127.0.0.1:9", "--gpu", "none"],
    "prime-validator": ["run", "--coordinator", "http://127.0.0.1:9"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(NODE_COMMANDS))
def test_a_second_node_on_one_data_dir_is_refused(tmp_path: Path, command: str) -> None:
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    from runtime.data_dir_lock import hold_data_dir

    with hold_data_dir(data_dir, command):
        # the real command, against no coordinator at all: the lock is checked before anything is contacted
        argv = [str(BIN / command), *NODE_COMMANDS[command], "--data-dir", str(data_dir)]
        result = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode != 0
    assert f"the data dir {data_dir} is in use by {command} (pid {os.getpid()}" in result.stderr
    assert "--data-dir" in result.stderr
