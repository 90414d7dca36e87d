"""The RL loop end to end: `prime-coordinator start` with `[orchestrator]` and `[local_network]`, real processes.

A reduced demo network (one HF worker, one validator, a relay, a 2-rank torchrun trainer,
a few small steps) runs to completion and exits 0; the ledger, /metrics and the trainer's
checkpoints show every step built from accepted, verified submissions, each used once. Then
the coordinator is SIGKILLed mid-run: no trainer rank or network node survives it, and the
same command resumes the run to the end with the batches recorded before the crash unchanged
and no accepted submission lost or used in two steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import ledger_rows
from trainer.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_STEPS = 3
GROUPS_PER_STEP = 1


def write_config(root: Path, port: int, local_network: bool = True, **orchestrator: Any) -> Path:
    """The reduced run's config; ``orchestrator`` overrides fields of its `[orchestrator]` section."""
    config = {
        "run_name": "orchestrator-test",
        "data_dir": str(root / "run"),
        "environment": {"type": "builtin", "name": "reverse_text"},
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {"async_level": 1, "prompts_per_task": 2, "group_size": 4, "max_tokens": 16, "lease_ttl_s": 60},
        "trust": {"validators_open": True},
        "policy": {"shard_size_bytes": 256 * 1024},
        "orchestrator": {
            "enabled": True,
            "num_steps": NUM_STEPS,
            "groups_per_step": GROUPS_PER_STEP,
            "trainer_launch": {"nproc": 2},
            "progress_interval_s": 2,
            **orchestrator,
        },
        "local_network": {"enabled": local_network, "engines": ["hf"], "num_validators": 1},
    }
    path = root / "run.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def steps_by_state(root: Path, state: str) -> dict[int, list[str]]:
    rows = ledger_rows(
        root,
        "SELECT t.step, s.submission_id FROM train_steps t JOIN step_submissions s ON s.step = t.step "
        f"WHERE t.state IN ({state}) ORDER BY t.step, s.position",
    )
    found: dict[int, list[str]] = {}
    for step, submission_id in rows:
        found.setdefault(step, []).append(submission_id)
    return found


def metric(url: str, name: str) -> float | None:
    try:
        body = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.TransportError:
        return None
    found = re.search(rf"^{name} (\S+)$", body, re.MULTILINE)
    return float(found.group(1)) if found else None


def wait_for(predicate: Callable[[], bool], coordinator: CoordinatorProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        running = coordinator.proc is not None and coordinator.proc.poll() is None
        assert running, coordinator.log_path.read_text()[-4000:]
        time.sleep(1)
    raise AssertionError(f"not reached within {timeout_s} s:\n{coordinator.log_path.read_text()[-4000:]}")


def descendants(pid: int) -> set[int]:
    """All live descendants of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def finish(coordinator: CoordinatorProcess, timeout_s: float) -> int:
    assert coordinator.proc is not None
    try:
        return coordinator.proc.wait(timeout=timeout_s)
    except Exception:
        coordinator.stop()
        raise


def check_completed_run(root: Path, stdout: str) -> dict[int, list[str]]:
    """What every finished run must show: steps from accepted submissions, each used once, policies, checkpoints."""
    published = steps_by_state(root, "'published'")
    assert sorted(published) == list(range(1, NUM_STEPS + 1))
    used = [sid for ids in published.values() for sid in ids]
    assert all(len(ids) == GROUPS_PER_STEP for ids in published.values())
    assert len(used) == len(set(used)), "an accepted submission was used in two steps"
    statuses = dict(
        (row[0], (row[1], row[2]))
        for row in ledger_rows(root, "SELECT submission_id, status, verdict_json FROM submissions")
    )
    for sid in used:
        status, verdict = statuses[sid]
        assert status == "accepted"
        assert len(json.loads(verdict)["rewards"]) > 0
    accepted_total = ledger_rows(root, "SELECT COUNT(*) FROM accepted_groups")[0][0]
    assert accepted_total >= len(used)
    versions = [row[0] for row in ledger_rows(root, "SELECT version FROM policy_versions ORDER BY version")]
    assert versions == list(range(NUM_STEPS + 1))
    metrics = [json.loads(row[0]) for row in ledger_rows(root, "SELECT metrics_json FROM train_steps ORDER BY step")]
    assert all(m["num_samples"] == GROUPS_PER_STEP * 2 * 4 and m["loss"] == m["loss"] for m in metrics)
    checkpoint = latest_checkpoint(root / "run" / "train" / "checkpoints")
    assert checkpoint is not None and checkpoint.name == f"step_{NUM_STEPS}"
    # Retention: published steps' exported policies and batch files are gone from train/, the origin store serves
    # the newest versions, and the last step's done marker stays for a trainer restarted at its checkpoint.
    train = root / "run" / "train"
    assert not [p for p in (train / "policies").iterdir() if not p.name.startswith(".")]
    assert not list((train / "batches").iterdir())
    assert sorted(p.name for p in (train / "done").iterdir()) == [f"step_{NUM_STEPS}.json"]
    assert (root / "run" / "policies" / f"v{NUM_STEPS}" / "manifest.json").is_file()
    assert "reward per step" in stdout and re.search(rf"^\s+{NUM_STEPS}\s+\d\.\d{{3}}", stdout, re.MULTILINE)
    check_final_policy(root, stdout)
    # The run's metrics file keeps every step once (a resumed run writes what the crash left out), with how
    # the batch's rollouts ended, though train/ keeps no published step's metrics.
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row["kind"] == "step"] == list(range(1, NUM_STEPS + 1)), rows
    for row in rows:
        assert row["batch_stop_fraction"] + row["batch_truncated_fraction"] == pytest.approx(1.0)
        assert 0 < row["batch_completion_tokens_mean"] <= 16 and "loss" in row and "grad_norm" in row
    return published


def check_final_policy(root: Path, stdout: str) -> None:
    """The last step's policy is kept whole, printed with an eval command whose config loads it."""
    from transformers import AutoModelForCausalLM

    from runtime.config import load_config
    from trainer.config import EvalConfig

    final = (root / "run" / "final-policy").resolve()
    assert f"final policy (v{NUM_STEPS}), an HF checkpoint: {final}" in stdout
    eval_config = (root / "run" / "final-eval.toml").resolve()
    assert f"prime-trainer eval -c {eval_config}" in stdout
    loaded = load_config(EvalConfig, eval_config)
    assert loaded.model == str(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    published = root / "run" / "policies" / f"v{NUM_STEPS}"
    assert (published / "manifest.json").is_file() and model.config.vocab_size > 0


def start(root: Path, config_path: Path, url: str, name: str) -> CoordinatorProcess:
    coordinator = CoordinatorProcess(
        config_path, root / f"{name}.log", {"PYTHONPATH": str(REPO_ROOT)}, stdout_path=root / f"{name}.out"
    )
    coordinator.start(url, timeout_s=300)
    return coordinator


def test_reduced_demo_network_trains_steps_from_accepted_rollouts(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = write_config(tmp_path, port)
    coordinator = start(tmp_path, config_path, url, "coordinator")
    seen_in_metrics = 0.0
    try:
        deadline = time.monotonic() + 540
        while coordinator.proc is not None and coordinator.proc.poll() is None and time.monotonic() < deadline:
            seen_in_metrics = max(seen_in_metrics, metric(url, "prime_train_steps_done") or 0.0)
            time.sleep(1)
        rc = finish(coordinator, 60)
    finally:
        coordinator.stop()
    stdout = (tmp_path / "coordinator.out").read_text()
    assert rc == 0, (tmp_path / "coordinator.log").read_text()[-4000:]
    assert seen_in_metrics >= 1, "/metrics never showed a completed step"
    check_completed_run(tmp_path, stdout)
    # the run's end reached its nodes: the worker and the validator stopped by themselves, saying why, with 0
    coordinator_log = (tmp_path / "coordinator.log").read_text()
    for name in ("worker-hf", "validator"):
        child_log = (tmp_path / "run" / "network" / f"{name}.log").read_text()
        assert f"has ended: its {NUM_STEPS} steps are trained" in child_log and "stopping" in child_log, name
        assert f"local {name} exited by itself with code 0" in coordinator_log, name
        assert "Traceback" not in child_log, child_log[-3000:]

    # The same command on a finished run reprints its curve and exits, starting nothing.
    command = [str(Path(sys.executable).parent / "prime-coordinator"), "start", "-c", str(config_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    reprinted = again.stdout
    assert "already trained all its steps" in reprinted and "starting the local network" not in reprinted
    check_completed_run(tmp_path, reprinted)


def test_sigkill_mid_run_then_restart_resumes_without_losing_or_reusing(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = write_config(tmp_path, port)
    first = start(tmp_path, config_path, url, "first")
    try:
        wait_for(lambda: (metric(url, "prime_train_steps_done") or 0) >= 1, first, timeout_s=400)
        children = descendants(first.pid)
        assert len(children) >= 5, "expected torchrun, 2 ranks, relay, worker and validator"
        before = steps_by_state(tmp_path, "'recorded', 'trained', 'published'")
        first.kill()
    finally:
        first.stop()
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in children if alive(pid)], "children outlived the SIGKILLed coordinator"

    second = start(tmp_path, config_path, url, "second")
    try:
        rc = finish(second, 540)
    finally:
        second.stop()
    assert rc == 0, (tmp_path / "second.log").read_text()[-4000:]
    published = check_completed_run(tmp_path, (tmp_path / "second.out").read_text())
    for step, ids in before.items():
        assert published[step] == ids, f"step {step} was recorded with {ids} before the crash"
    assert "resuming the RL loop" in (tmp_path / "second.log").read_text() or before == {}
    assert os.path.isdir(tmp_path / "run" / "network" / "worker-hf")


def test_a_dead_trainer_stops_the_run_with_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = write_config(tmp_path, port, local_network=False)
    coordinator = start(tmp_path, config_path, url, "coordinator")
    try:
        wait_for(lambda: len(descendants(coordinator.pid)) >= 3, coordinator, timeout_s=120)  # torchrun + 2 ranks
        job = descendants(coordinator.pid)
        os.kill(min(job), signal.SIGKILL)  # torchrun: the coordinator's first child
        rc = finish(coordinator, 60)
    finally:
        coordinator.stop()
    assert rc != 0
    log = (tmp_path / "coordinator.log").read_text()
    assert "the trainer service (torchrun" in log and "trainer.log" in log and "resumes from the last" in log
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in job if alive(pid)], "trainer ranks outlived their torchrun"
