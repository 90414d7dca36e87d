"""A run's history outside the coordinator: TensorBoard, W&B (offline) and `prime-coordinator metrics export`.

`prime-coordinator start` with `[orchestrator]` (an eval every step), `[orchestrator.tracking]`
(`tensorboard = true`, `wandb.mode = "offline"`) and `[local_network]` (one HF worker, a validator,
a relay, the torchrun trainer) trains a few steps of reverse_text from a tiny random policy. Then
the TensorBoard event files, read back with TensorBoard's own EventAccumulator, must hold every
figure of every step row of `metrics.jsonl` at that step, and every eval; the W&B offline run
file, read record by record, must hold the same (nothing is sent anywhere: offline mode). Last,
`prime-coordinator metrics export` through the real CLI writes the run's rows from the ledger, as
JSON lines equal to `metrics.jsonl`'s and as CSV with a column per figure; a run directory
without a ledger is refused in one line.
"""

from __future__ import annotations

import csv
import json
import math
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import tiny_policy
from tests.support.run_configs import write_small_run

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_STEPS = 2
CHECKED_STEP_KEYS = ("loss", "entropy", "grad_norm", "mismatch_kl", "batch_reward_mean", "batch_stop_fraction")
WANDB_BLOCK = 32768
WANDB_FULL, WANDB_LAST = 1, 4


def write_config(root: Path, port: int, start_checkpoint: Path) -> Path:
    tracking = {"tensorboard": True, "wandb": {"mode": "offline", "project": "prime-network-test"}}
    return write_small_run(
        root,
        port,
        "run-history-test",
        start_checkpoint,
        NUM_STEPS,
        eval_every_steps=1,
        eval_num_examples=4,
        tracking=tracking,
    )


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "prime-coordinator"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def tracked(row: dict[str, Any]) -> dict[str, float]:
    """What the trackers get of a metrics.jsonl row: its finite numbers under ``train/`` or ``eval/``."""
    prefix = "train" if row["kind"] == "step" else "eval"
    return {
        f"{prefix}/{key.removeprefix('eval_') if prefix == 'eval' else key}": float(value)
        for key, value in row.items()
        if key not in ("kind", "step", "at") and isinstance(value, int | float) and math.isfinite(value)
    }


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a W&B run file (a LevelDB-style log: 7-byte file header, 32 KiB blocks of chunks)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        pending += data[pos : pos + length]
        pos += length
        if kind in (WANDB_FULL, WANDB_LAST):
            yield pending
            pending = b""


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    from wandb.proto import wandb_internal_pb2

    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for data in wandb_records(run_file):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated protobuf code, no stubs
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def test_a_run_is_in_tensorboard_wandb_and_the_metrics_export(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    port = free_port()
    coordinator = CoordinatorProcess(
        write_config(tmp_path, port, tiny_policy(tmp_path / "start", seed=11)),
        tmp_path / "coordinator.log",
        {"PYTHONPATH": str(REPO_ROOT), "WANDB_SILENT": "true"},
        stdout_path=tmp_path / "coordinator.out",
    )
    coordinator.start(f"http://127.0.0.1:{port}", timeout_s=300)
    try:
        assert coordinator.proc is not None
        rc = coordinator.proc.wait(timeout=900)
    finally:
        coordinator.stop()
    log = (tmp_path / "coordinator.log").read_text()
    assert rc == 0, log[-4000:]

    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "step"]
    evals = [row for row in rows if row["kind"] == "eval"]
    assert [row["step"] for row in steps] == list(range(1, NUM_STEPS + 1)), rows
    assert sorted(row["step"] for row in evals) == list(range(NUM_STEPS + 1)), rows

    # TensorBoard: every figure of every row, at its step.
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    for key in CHECKED_STEP_KEYS:
        assert sorted(scalars.get(f"train/{key}", {})) == list(range(1, NUM_STEPS + 1)), (key, sorted(scalars))
    assert sorted(scalars["eval/accuracy"]) == list(range(NUM_STEPS + 1))
    for row in rows:
        for tag, value in tracked(row).items():
            assert scalars[tag][row["step"]] == pytest.approx(value, rel=1e-6), (tag, row["step"])

    # W&B, offline: the same rows in its run file, each with its series' own step.
    history = wandb_history(run_dir)
    logged = {("step", h["train/step"]) if "train/step" in h else ("eval", h["eval/step"]): h for h in history}
    assert sorted(logged) == sorted((row["kind"], row["step"]) for row in rows), sorted(logged)
    for row in rows:
        entry = logged[(row["kind"], row["step"])]
        for tag, value in tracked(row).items():
            assert entry[tag] == pytest.approx(value, rel=1e-6), (tag, row["step"])
    assert (run_dir / "wandb-run-id").is_file()

    # The export: from the ledger, the rows of metrics.jsonl (their times are the ledger's own).
    config = str(tmp_path / "run.toml")
    exported = cli("metrics", "export", "-c", config, "--format", "jsonl", "--output", "metrics.jsonl", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert f"exported {NUM_STEPS} step row(s) and {NUM_STEPS + 1} eval row(s)" in exported.stdout
    again = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    without_time = [{k: v for k, v in row.items() if k != "at"} for row in rows]
    assert sorted(without_time, key=lambda r: (r["kind"], r["step"])) == sorted(
        ({k: v for k, v in row.items() if k != "at"} for row in again), key=lambda r: (r["kind"], r["step"])
    )
    as_csv = cli("metrics", "export", "-c", config, cwd=tmp_path)
    assert as_csv.returncode == 0, as_csv.stderr
    table = list(csv.DictReader(as_csv.stdout.splitlines()))
    assert [(r["kind"], int(r["step"])) for r in table] == [(r["kind"], r["step"]) for r in again]
    for shown, row in zip(table, again, strict=True):
        for key in CHECKED_STEP_KEYS if row["kind"] == "step" else ("eval_accuracy",):
            assert float(shown[key]) == pytest.approx(row[key]), key

    missing = cli("metrics", "export", "--data-dir", str(tmp_path / "no-such-run"), cwd=tmp_path)
    assert missing.returncode != 0
    assert "no ledger at" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
