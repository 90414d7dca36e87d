"""The soak: the demo workload for many steps, watching every process's memory and every directory's bytes.

Runs ``prime-coordinator start -c configs/demo.toml`` (real coordinator with its torchrun trainer,
a relay, a vLLM and an HF worker and a validator, all on 127.0.0.1) for ``--steps`` steps in a
fresh run directory, and every ``--interval`` seconds samples the RSS of each process of the tree
(summed by role: a process counts for its nearest ancestor with a role) and the bytes of each
directory the run writes (each file counted once per directory, whatever its hard links).

Prints one JSON object; ``summary`` holds ``steps``, ``rss_growth_mib_per_kstep`` (per role: the
least-squares slope of RSS against the step after the first 100 steps, in MiB per 1,000 steps),
``disk_growth_bytes_per_step`` (per directory, the slope after the same warm-up),
``train_dir_bounded`` (1 when ``train/`` in the second half of the measured window is never larger
than its peak in the first half, plus 5 %), ``child_logs_bounded`` (1 when each child's log with
its rotated files stays within 4 x ``--child-log-mib``; ``child_log_rotations`` counts the rotated
files), ``ledger_bytes_per_sample`` (ledger database bytes per
sample stored in it), ``batch_write_s`` / ``batch_read_s`` (one 256-sample x 4,096-token batch file
through :class:`trainer.transport.TrainDir`), ``reward_start`` / ``reward_end`` (mean batch reward
of the first and last 10 steps) and ``rejected`` (submissions rejected).

    python -m bench.soak --quick        # 200 steps, ~6 min on a busy 2-core CPU
    python -m bench.soak                # 1,000 steps, ~30 min
    python -m bench.soak --child-log-mib 0.25   # logs small enough to rotate within the run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from coordinator.config import ChildLogsConfig
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import read_ledger
from trainer.transport import StepBatch, TrainDir, TrainSample, write_json_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]

WARMUP_STEPS = 100
TRANSIENT = re.compile(r"^(v\d+|step_\d+|\..*)$")
"""Names of one version's or one step's folder (or a staging one): their parent's growth is what counts."""


def process_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, RSS in MiB) of every readable process."""
    table: dict[int, tuple[int, str, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            rss_kib = 0
            for line in Path(entry.path, "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kib = int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
        table[int(entry.name)] = (ppid, cmdline, rss_kib / 1024)
    return table


def role_of(cmdline: str) -> str | None:
    if "torch.distributed.run" in cmdline or "torchrun" in cmdline:
        return "torchrun"
    if "trainer.service" in cmdline:
        return "trainer"
    if "prime-relay" in cmdline or "shardcast.cli" in cmdline:
        return "relay"
    if "prime-validator" in cmdline or "validator.cli" in cmdline:
        return "validator"
    if "prime-worker" in cmdline or "worker.cli" in cmdline:
        return "worker-vllm" if "vllm" in cmdline else "worker-hf" if "hf" in cmdline else "worker"
    return None


def rss_by_role(root_pid: int) -> dict[str, float]:
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[str, float] = {}
    todo = [(root_pid, "coordinator")]
    while todo:
        pid, inherited = todo.pop()
        if pid not in table:
            continue
        _, cmdline, rss = table[pid]
        role = (role_of(cmdline) if pid != root_pid else None) or inherited
        totals[role] = totals.get(role, 0.0) + rss
        todo.extend((child, role) for child in children.get(pid, []))
    return totals


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path``, each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    if path.is_file():
        return path.stat().st_size
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def watched_dirs(run_dir: Path) -> dict[str, Path]:
    """Every directory (and top-level file) the run writes, two levels deep (the network's nodes: three)."""
    found: dict[str, Path] = {}
    if not run_dir.is_dir():
        return found
    for top in run_dir.iterdir():
        found[top.name] = top
        if top.is_dir():
            for sub in top.iterdir():
                found[f"{top.name}/{sub.name}"] = sub
                if top.name == "network" and sub.is_dir():
                    for leaf in sub.iterdir():
                        if leaf.is_dir():
                            found[f"{top.name}/{sub.name}/{leaf.name}"] = leaf
    return found


def ledger_query(run_dir: Path, statement: str) -> list[tuple[Any, ...]]:
    return read_ledger(run_dir / "ledger.db", statement)


def published_steps(run_dir: Path) -> int:
    rows = ledger_query(run_dir, "SELECT MAX(step) FROM train_steps WHERE state = 'published'")
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y against x."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den


def batch_io(directory: Path, samples: int, tokens: int, prompt_tokens: int = 512) -> dict[str, float]:
    """Write and read one batch of ``samples`` x ``tokens`` through the transport (and, for scale, as JSON)."""
    rng = random.Random(0)
    completion = tokens - prompt_tokens
    batch = StepBatch(
        1,
        [
            TrainSample(
                prompt_ids=[rng.randrange(150_000) for _ in range(prompt_tokens)],
                completion_ids=[rng.randrange(150_000) for _ in range(completion)],
                advantage=rng.gauss(0, 1),
                inference_logprobs=[-rng.expovariate(1.0) for _ in range(completion)],
                reward=rng.random(),
            )
            for _ in range(samples)
        ],
        1.0,
        [f"submission-{i}" for i in range(samples // 32)],
    )
    train_dir = TrainDir(directory)
    started = time.perf_counter()
    train_dir.write_batch(batch)
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    read = train_dir.read_batch(1)
    read_s = time.perf_counter() - started
    assert read == batch, "the batch did not round-trip"
    size = train_dir.batch_path(1).stat().st_size
    legacy = {
        "step": 1,
        "temperature": 1.0,
        "submission_ids": batch.submission_ids,
        "samples": [vars(s) for s in batch.samples],
    }
    started = time.perf_counter()
    write_json_atomic(train_dir.legacy_batch_path(2), legacy)
    json_write_s = time.perf_counter() - started
    train_dir.batch_path(1).unlink()
    started = time.perf_counter()
    train_dir.legacy_batch_path(2).rename(train_dir.legacy_batch_path(1))
    assert train_dir.read_batch(1) == batch
    json_read_s = time.perf_counter() - started
    return {
        "batch_write_s": round(write_s, 3),
        "batch_read_s": round(read_s, 3),
        "batch_bytes": size,
        "json_batch_write_s": round(json_write_s, 3),
        "json_batch_read_s": round(json_read_s, 3),
        "json_batch_bytes": train_dir.legacy_batch_path(1).stat().st_size,
    }


def run_soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    run_dir = work / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = work / "soak.toml"
    config_path.write_text((REPO_ROOT / "configs" / "demo.toml").read_text())
    sets = [
        f"orchestrator.num_steps={args.steps}",
        f"data_dir={run_dir}",
        f"api.port={port}",
        "orchestrator.progress_interval_s=60",
        f"child_logs.max_mib={args.child_log_mib}",
    ]
    extra = tuple(arg for item in sets for arg in ("--set", item))
    coordinator = CoordinatorProcess(
        config_path, work / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)}, stdout_path=work / "coordinator.out"
    )
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    coordinator.start(url, extra_args=extra, timeout_s=300)
    try:
        assert coordinator.proc is not None
        while coordinator.proc.poll() is None:
            if time.monotonic() - started > args.max_minutes * 60:
                print(f"soak: {args.max_minutes} min are up; stopping the run where it is", file=sys.stderr)
                break
            samples.append(
                {
                    "t": round(time.monotonic() - started, 1),
                    "step": published_steps(run_dir),
                    "rss_mib": {k: round(v, 1) for k, v in rss_by_role(coordinator.pid).items()},
                    "bytes": {name: tree_bytes(path) for name, path in watched_dirs(run_dir).items()},
                }
            )
            print(f"soak: {samples[-1]['t']} s, step {samples[-1]['step']}", file=sys.stderr, flush=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                coordinator.proc.wait(timeout=args.interval)
        rc = coordinator.proc.returncode
    finally:
        coordinator.stop()
    if rc is not None and rc != 0:
        raise RuntimeError(f"the coordinator exited {rc}:\n{(work / 'coordinator.log').read_text()[-3000:]}")
    elapsed = time.monotonic() - started
    final_bytes = {name: tree_bytes(path) for name, path in watched_dirs(run_dir).items()}
    return {"samples": samples, "elapsed_s": round(elapsed, 1), "final_bytes": final_bytes, "run_dir": run_dir}


def child_logs(run_dir: Path, max_mib: float, backups: int = ChildLogsConfig().backups) -> dict[str, Any]:
    """Whether every child's log and its rotated files stay within ``(backups + 1) * max_mib``."""
    limit = (backups + 1) * max_mib * (1 << 20)
    families = {path: [path, *path.parent.glob(f"{path.name}.*")] for path in run_dir.rglob("*.log")}
    sizes = {str(path.relative_to(run_dir)): sum(p.stat().st_size for p in files) for path, files in families.items()}
    return {
        "child_log_bytes": sizes,
        "child_log_rotations": sum(len(files) - 1 for files in families.values()),
        "child_logs_bounded": int(bool(sizes) and max(sizes.values()) <= limit),
    }


def summarize(args: argparse.Namespace, soak: dict[str, Any], io: dict[str, float]) -> dict[str, Any]:
    run_dir: Path = soak["run_dir"]
    samples = [s for s in soak["samples"] if s["step"] >= min(WARMUP_STEPS, args.steps // 2)]
    roles = sorted({role for s in samples for role in s["rss_mib"]})
    rss_growth = {}
    for role in roles:
        fitted = slope([(s["step"], s["rss_mib"][role]) for s in samples if role in s["rss_mib"]])
        rss_growth[role] = None if fitted is None else round(fitted * 1000, 2)
    names = sorted({name for s in samples for name in s["bytes"] if not TRANSIENT.match(name.rsplit("/", 1)[-1])})
    disk_growth = {}
    for name in names:
        fitted = slope([(s["step"], s["bytes"][name]) for s in samples if name in s["bytes"]])
        disk_growth[name] = None if fitted is None else round(fitted, 1)
    train = [(s["step"], s["bytes"].get("train", 0)) for s in samples]
    middle = (train[0][0] + train[-1][0]) / 2 if train else 0
    first = [b for step, b in train if step <= middle]
    second = [b for step, b in train if step > middle]
    bounded = int(bool(first) and bool(second) and max(second) <= 1.05 * max(first))
    counted = ledger_query(run_dir, "SELECT SUM(json_array_length(body_json, '$.rollouts')) FROM submissions")
    stored_samples = int(counted[0][0] or 0) if counted else 0
    ledger_bytes = sum(tree_bytes(p) for p in run_dir.glob("ledger.db*"))
    rewards = [
        json.loads(row[0]).get("batch_reward_mean", 0.0)
        for row in ledger_query(run_dir, "SELECT metrics_json FROM train_steps ORDER BY step")
        if row[0]
    ]
    rejected = ledger_query(run_dir, "SELECT COUNT(*) FROM submissions WHERE status = 'rejected'")[0][0]
    return {
        "steps": published_steps(run_dir),
        "completed": published_steps(run_dir) >= args.steps,
        "elapsed_s": soak["elapsed_s"],
        "rss_growth_mib_per_kstep": rss_growth,
        "rss_mib_last": next((s["rss_mib"] for s in reversed(samples) if len(s["rss_mib"]) == len(roles)), {}),
        "disk_growth_bytes_per_step": disk_growth,
        "final_bytes": soak["final_bytes"],
        "train_dir_bounded": bounded,
        **child_logs(run_dir, args.child_log_mib),
        "train_dir_bytes_max": max((b for _, b in train), default=0),
        "ledger_bytes_per_sample": round(ledger_bytes / stored_samples, 1) if stored_samples else None,
        **io,
        "reward_start": round(statistics.fmean(rewards[:10]), 4) if rewards else None,
        "reward_end": round(statistics.fmean(rewards[-10:]), 4) if rewards else None,
        "rejected": rejected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 steps instead of 1,000")
    parser.add_argument("--steps", type=int, default=None, help="steps to run (default 1,000; 200 with --quick)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=240.0,
        help="stop the run after this long and report the steps it reached (summary.completed is then false)",
    )
    parser.add_argument(
        "--child-log-mib",
        type=float,
        default=16.0,
        help="child_logs.max_mib of the run (a small value shows the logs rotating within the soak)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the run here (default: a temporary dir)")
    args = parser.parse_args()
    args.steps = args.steps or (200 if args.quick else 1000)
    with tempfile.TemporaryDirectory(prefix="prime-soak-") as scratch:
        work = args.work_dir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        soak = run_soak(args, work)
        io = batch_io(Path(scratch) / "batch-io", samples=256, tokens=4096)
        summary = summarize(args, soak, io)
    result = {
        "bench": "soak",
        "config": {"steps": args.steps, "interval_s": args.interval, "workload": "configs/demo.toml"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "summary": summary,
        "samples": soak["samples"][:: max(1, len(soak["samples"]) // 200)],
    }
    json.dump(result, sys.stdout, default=str)
    print()


if __name__ == "__main__":
    main()
