"""Async RL vs on-policy: the demo network with async_level k = 0 and k = 2, generation and training pinned apart.

Runs `prime-coordinator start` twice on the demo configuration (built-in start checkpoint,
reverse_text, a relay, workers and a validator as the coordinator's children), once with k = 0
and once with k = 2. In both runs the relay, workers and validators are pinned to one set of
cores and the trainer ranks to another (`local_network.cpus`, `orchestrator.trainer_launch.cpus`), as
inference and training sit on separate GPUs in a real deployment. From each run's ledger:

- wall time per step: between the publication of step 3 and the last one (start-up and the
  groups generated during it excluded);
- training time per step: from recording a step's batch to publishing its policy;
- busy fraction of training (training time / wall time), of generation (the union of each
  worker's lease-to-submission intervals over the same window, averaged over workers) and of
  validation (the union of each validator's intervals from the ledger handing it pending
  submissions, its ``hand_out`` event, to its last vote on them, averaged over validators);
- idle time (``idle_s_per_step``, ``idle_fraction``): the part of the window in which no stage
  works, neither generating nor validating nor training (1 - the union of all those intervals
  over the window). Every hand-off of the loop is event-driven (long-polls on the ledger, the
  trainer's doorbells), so at k = 0 this is what the loop's own latency costs; ``other_s_per_step``
  is what is neither generation nor training (validation, hand-offs) and goes negative where
  stages overlap;
- reward per step (the validator-recomputed reward of the step's batch).

Prints one JSON object; ``summary``: ``async_speedup`` (steps/hour of k = 2 over k = 0),
``ideal_speedup`` ((generation + training) / max(generation, training) per step, from the k = 0
run, generation being the workers' busy time per step), ``overlap_efficiency`` (async_speedup /
ideal_speedup), ``validation_s_per_step`` (the validators' busy time per step at k = 0),
``sync_overhead_fraction`` (the k = 0 run's ``idle_fraction``: how far the synchronous baseline
is from costing only its compute; the speedup is measured against that baseline),
``reward_gap`` (k = 2 minus k = 0 at the last common step).

Measured 2026-12-01 at commit 9313ab7 (2-core x86_64 CPU, 24 GiB, no GPU; bench/results/):
full run 1.95 s per step at k = 0 with ``sync_overhead_fraction`` 0.009, 1.17 s at k = 2,
``async_speedup`` 1.67; `--quick` 1.20 s per step at k = 0 with ``sync_overhead_fraction`` 0.047
(0.54 and 2.18 s per step at commit 732c689, before the loop's hand-offs were event-driven), 0.69 s
at k = 2, ``async_speedup`` 1.75. docs/benchmarks.md has the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w
from sqlalchemy import create_engine, text

from runtime.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WARMUP_STEPS = 3


def run_config(root: Path, k: int, steps: int, quick: bool, cores: tuple[list[int], list[int]]) -> Path:
    generation_cpus, training_cpus = cores
    config: dict[str, Any] = {
        "run_name": f"async-bench-k{k}",
        "data_dir": str(root / f"k{k}"),
        "environment": {"type": "builtin", "name": "reverse_text"},
        "api": {"host": "127.0.0.1", "port": free_port(), "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {"async_level": k, "prompts_per_task": 4, "group_size": 8, "max_tokens": 32},
        "trust": {"validators_open": True},
        "policy": {"shard_size_bytes": 256 * 1024, "keep_versions": k + 2},
        "orchestrator": {
            "enabled": True,
            "num_steps": steps,
            "groups_per_step": 2 if quick else 4,
            "trainer_launch": {"nproc": 1, "cpus": training_cpus},
            "progress_interval_s": 10,
            "trainer": {"optimizer": {"lr": 5e-4}},
        },
        "local_network": {"enabled": True, "engines": ["hf"] if quick else ["vllm", "hf"], "cpus": generation_cpus},
    }
    path = root / f"k{k}.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def validation_spans(
    hand_outs: Sequence[Any], votes: Sequence[Any], first: float, last: float
) -> dict[str, list[tuple[float, float]]]:
    """Each validator's busy intervals in [first, last]: from the ledger handing it pending submissions (a
    ``hand_out`` event) to its last vote on them; a hand-out it voted on none of (it could not audit them) is
    left out."""
    posted = {(v.validator_id, v.submission_id): v.posted_at for v in votes}
    spans: dict[str, list[tuple[float, float]]] = {}
    for node_id, at, data_json in hand_outs:
        ends = [posted[(node_id, sid)] for sid in json.loads(data_json)["submission_ids"] if (node_id, sid) in posted]
        if not ends:
            continue
        clipped = (max(at, first), min(max(ends), last))
        if clipped[1] > clipped[0]:
            spans.setdefault(node_id, []).append(clipped)
    return spans


def measure(data_dir: Path) -> dict[str, Any]:
    engine = create_engine(f"sqlite:///{data_dir / 'ledger.db'}")
    with engine.connect() as conn:
        steps = conn.execute(
            text("SELECT step, recorded_at, published_at, metrics_json FROM train_steps ORDER BY step")
        ).all()
        leases = conn.execute(
            text(
                "SELECT l.node_id, l.issued_at, s.submitted_at FROM leases l "
                "JOIN submissions s ON s.lease_id = l.lease_id"
            )
        ).all()
        hand_outs = conn.execute(text("SELECT node_id, at, data_json FROM events WHERE kind = 'hand_out'")).all()
        votes = conn.execute(text("SELECT validator_id, submission_id, posted_at FROM verdict_votes")).all()
    engine.dispose()
    # Steady state: from the publication of step WARMUP_STEPS on (groups generated during start-up,
    # up to k + 1 steps' worth, would otherwise make the first steps of k > 0 look free).
    warm = min(WARMUP_STEPS, len(steps) - 2)
    first, last = steps[warm].published_at, steps[-1].published_at
    window = last - first
    num = len(steps) - 1 - warm
    train_times = [s.published_at - s.recorded_at for s in steps[warm + 1 :]]
    by_node: dict[str, list[tuple[float, float]]] = {}
    for node_id, issued_at, submitted_at in leases:
        clipped = (max(issued_at, first), min(submitted_at, last))
        if clipped[1] > clipped[0]:
            by_node.setdefault(node_id, []).append(clipped)
    generation_busy = [union_length(spans) / window for spans in by_node.values()]
    by_validator = validation_spans(hand_outs, votes, first, last)
    validation_busy = [union_length(spans) / window for spans in by_validator.values()]
    training_spans = [(max(s.recorded_at, first), min(s.published_at, last)) for s in steps[warm + 1 :]]
    everything = [span for spans in (*by_node.values(), *by_validator.values()) for span in spans] + training_spans
    wall = window / num
    train = sum(train_times) / len(train_times)
    generation_busy_fraction = sum(generation_busy) / len(generation_busy) if generation_busy else 0.0
    validation_busy_fraction = sum(validation_busy) / len(validation_busy) if validation_busy else 0.0
    return {
        "wall_s_per_step": wall,
        "train_s_per_step": train,
        "generation_s_per_step": generation_busy_fraction * wall,
        "validation_s_per_step": validation_busy_fraction * wall,
        "other_s_per_step": wall - train - generation_busy_fraction * wall,
        "idle_s_per_step": (window - union_length(everything)) / num,
        "idle_fraction": 1.0 - union_length(everything) / window,
        "training_busy_fraction": train / wall,
        "generation_busy_fraction": generation_busy_fraction,
        "validation_busy_fraction": validation_busy_fraction,
        "reward_per_step": [json.loads(s.metrics_json)["batch_reward_mean"] for s in steps],
        "staleness_per_step": [json.loads(s.metrics_json)["batch_staleness_mean"] for s in steps],
    }


def run(root: Path, k: int, steps: int, quick: bool, cores: tuple[list[int], list[int]]) -> dict[str, Any]:
    config = run_config(root, k, steps, quick, cores)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.monotonic()
    with (root / f"k{k}.log").open("wb") as log:
        done = subprocess.run(
            [str(BIN / "prime-coordinator"), "start", "-c", str(config)], stdout=log, stderr=log, env=env, timeout=1800
        )
    if done.returncode != 0:
        raise SystemExit(f"k={k} run failed; see {root / f'k{k}.log'}")
    result = measure(root / f"k{k}")
    result["total_s"] = time.monotonic() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller steps and one HF worker")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default 12 quick, 24 full)")
    parser.add_argument("--dir", type=Path, default=Path("runs/async-bench"))
    args = parser.parse_args()
    steps = args.steps or (12 if args.quick else 24)
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    cores = (cpus[:half], cpus[half:] or cpus[:half])
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    sync, asynchronous = run(root, 0, steps, args.quick, cores), run(root, 2, steps, args.quick, cores)
    async_speedup = sync["wall_s_per_step"] / asynchronous["wall_s_per_step"]
    generation, training = sync["generation_s_per_step"], sync["train_s_per_step"]
    ideal = (generation + training) / max(generation, training)
    common = min(len(sync["reward_per_step"]), len(asynchronous["reward_per_step"])) - 1
    summary = {
        "async_speedup": async_speedup,
        "ideal_speedup": ideal,
        "overlap_efficiency": async_speedup / ideal,
        "validation_s_per_step": sync["validation_s_per_step"],
        "sync_overhead_fraction": sync["idle_fraction"],
        "reward_gap": asynchronous["reward_per_step"][common] - sync["reward_per_step"][common],
    }
    report = {
        "summary": summary,
        "k0": sync,
        "k2": asynchronous,
        "steps": steps,
        "generation_cpus": cores[0],
        "training_cpus": cores[1],
        "quick": args.quick,
        "warmup_steps_excluded": WARMUP_STEPS,
        "run_dir": str(root),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
