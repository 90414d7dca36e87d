"""Adaptive audit against full audit on the demo network with honest and cheating workers: one JSON object.

Two runs of the demo's task and start (``sort_digits`` from ``builtin:small-qwen3-sort-start``) through
the real network, the same steps and batch: one with every sample recomputed
(``validation.audit_fraction = 1``), one with ``[validation.adaptive]`` (``--full-audit-results``,
``--floor``, ``--reaudit-share``). Each has the local network's honest HF worker and validator, one more
honest worker and three cheating workers (:mod:`tests.support.cheating_worker`): ``always`` (every
task, every sample but the first copied), ``record`` (honest for ``--record-tasks`` tasks, then one
copied sample per task) and ``rarely`` (one copied sample in a task with probability ``--rate``). A
copied sample is generation saved; its draws do not follow its noise stream, so a recomputation
catches it.

Summary keys: ``validator_cost_ratio``: the validator's CPU seconds while auditing (prefill, checks
and rewards, every thread of its process; :class:`validator.progress.ValidatorState`) per accepted
sample, adaptive over full (goal <= 0.2; CPU time, as the workers and the trainer share the cores
and stretch its wall-clock seconds unevenly; the wall-clock ratio is reported beside it);
``cheated_trained_fraction``: cheated samples in training steps over all trained samples,
adaptive run (goal <= 0.001 and within the bound); ``honest_rejections``: honest workers' rejected
submissions in both runs (0); ``bound_cheated_fraction``: the policy's cheating bound
(:func:`coordinator.ledger.audit_policy.cheat_bound`) with the calibrations' detection power. Per run
and per strategy: submissions, cheated ones, rejections, re-audit catches, bans, trained cheated samples.

Usage: ``python -m bench.audit_bench [--quick] [--steps N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.runs import REPO_ROOT, network_run_config
from runtime.children import stop_processes
from tests.support.coordinator_process import CoordinatorProcess

START = "builtin:small-qwen3-sort-start"
ENVIRONMENT: dict[str, Any] = {"type": "builtin", "name": "sort_digits"}
CHEATERS = ("always", "record", "rarely")
RUN_TIMEOUT_S = 5400


def log(message: str) -> None:
    print(f"[audit_bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (8 steps)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 40; quick 8)")
    parser.add_argument("--groups-per-step", type=int, default=12)
    parser.add_argument("--prompts-per-task", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--full-audit-results", type=int, default=10)
    parser.add_argument("--floor", type=float, default=0.05)
    parser.add_argument("--reaudit-share", type=float, default=0.05)
    parser.add_argument("--record-tasks", type=int, default=25, help="the record cheater's honest tasks first")
    parser.add_argument("--rate", type=float, default=0.1, help="the rare cheater's share of cheated tasks")
    parser.add_argument("--dir", type=Path, default=Path("runs/audit_bench"))
    args = parser.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 40)
    # what bench.runs.network_run_config reads
    args.lr, args.warmup_steps, args.trainer_ranks, args.engines = 1e-5, 0, 1, ["hf"]
    return args


def run_config(root: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from trainer.resolve import resolve_model_path

    start = resolve_model_path(START)
    config = network_run_config(f"audit-{mode}", root, start, ENVIRONMENT, 0, args)
    config["scheduling"]["prompts_per_task"] = args.prompts_per_task
    config["trust"]["ban_after_rejections"] = 3
    if mode == "adaptive":
        config["validation"] = {
            "adaptive": {
                "enabled": True,
                "full_audit_results": args.full_audit_results,
                "floor": args.floor,
                "reaudit_share": args.reaudit_share,
            }
        }
    else:
        config["validation"] = {"audit_fraction": 1.0}
    return config


def node_id_of(data_dir: Path) -> str | None:
    from protocol.identity import key_path, load_identity

    return load_identity(key_path(data_dir)).node_id if key_path(data_dir).exists() else None


def run_network(root: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run to its end with the extra workers beside it; what the ledger, the validator and the cheaters say."""
    import tomli_w

    root.mkdir(parents=True, exist_ok=True)
    config = run_config(root, mode, args)
    (root / "run.toml").write_text(tomli_w.dumps(config))
    url = f"http://127.0.0.1:{config['api']['port']}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.monotonic()
    log_path = root / "coordinator.log"
    coordinator = CoordinatorProcess(root / "run.toml", log_path, env, stdout_path=log_path)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        coordinator.start(url, timeout_s=600)
        for index, strategy in enumerate(("honest", *CHEATERS)):
            data_dir = root / "workers" / strategy
            data_dir.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "tests.support.cheating_worker", url, str(data_dir), strategy]
            command += ["--record-tasks", str(args.record_tasks), "--rate", str(args.rate), "--seed", str(index)]
            with (data_dir.parent / f"{strategy}.log").open("wb") as out:
                workers.append(subprocess.Popen(command, stdout=out, stderr=out, env=env))
        assert coordinator.proc is not None
        rc = coordinator.proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        coordinator.stop()
        stop_processes(workers)
    if rc != 0:
        raise SystemExit(f"the {mode} run failed (exit {rc}); see {root / 'coordinator.log'}")
    return measure(root, mode, args, time.monotonic() - started)


def _validator_figures(root: Path) -> dict[str, Any]:
    """The validator's last figures line (its totals when it stopped)."""
    last: dict[str, Any] = {}
    for line in (root / "run" / "network" / "validator.log").read_text(errors="replace").splitlines():
        if '"audit_s"' in line:
            try:
                last = json.loads(line)
            except ValueError:
                continue
    if not last:
        raise SystemExit(f"no figures in {root / 'run' / 'network' / 'validator.log'}")
    return last


def measure(root: Path, mode: str, args: argparse.Namespace, elapsed_s: float) -> dict[str, Any]:
    strategies = {node_id_of(root / "workers" / s): s for s in ("honest", *CHEATERS)}
    cheats: dict[tuple[str, str], int] = {}
    for strategy in CHEATERS:
        path = root / "workers" / strategy / "cheats.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            entry = json.loads(line)
            cheats[(entry["node_id"], entry["task_id"])] = len(entry["uids"])
    db = sqlite3.connect(root / "run" / "ledger.db")
    try:
        subs = db.execute("SELECT submission_id, node_id, task_id, status, body_json FROM submissions").fetchall()
        trained = {row[0] for row in db.execute("SELECT submission_id FROM step_submissions")}
        nodes = {row[0]: bool(row[1]) for row in db.execute("SELECT node_id, banned FROM nodes WHERE role='worker'")}
        events = db.execute("SELECT subject, data_json FROM events WHERE kind = 'reaudit'").fetchall()
    finally:
        db.close()
    per: dict[str, dict[str, Any]] = {}
    accepted_samples = trained_samples = trained_cheated = honest_rejections = 0
    for submission_id, node_id, task_id, status, body in subs:
        strategy = strategies.get(node_id, "honest-local")
        mine = per.setdefault(strategy, {"submissions": 0, "cheated": 0, "rejected": 0, "trained_cheated_samples": 0})
        samples = len(json.loads(body)["rollouts"])
        copied = cheats.get((node_id, task_id), 0)
        mine["submissions"] += 1
        mine["cheated"] += copied > 0
        mine["rejected"] += status == "rejected"
        mine["cheated_rejected"] = mine.get("cheated_rejected", 0) + (copied > 0 and status == "rejected")
        if status == "accepted":
            accepted_samples += samples
        if submission_id in trained:
            trained_samples += samples
            trained_cheated += copied
            mine["trained_cheated_samples"] += copied
        if strategy.startswith("honest") and status == "rejected":
            honest_rejections += 1
    for _subject, data in events:
        found = json.loads(data)
        strategy = strategies.get(found.get("worker_id"), "honest-local")
        mine = per.setdefault(strategy, {"submissions": 0, "cheated": 0, "rejected": 0, "trained_cheated_samples": 0})
        key = "reaudits_passed" if found.get("passed") else "reaudit_catches"
        mine[key] = mine.get(key, 0) + 1
    for node_id, banned in nodes.items():
        strategy = strategies.get(node_id, "honest-local")
        per.setdefault(strategy, {})["banned"] = banned
    figures = _validator_figures(root)
    cheated = sum(mine.get("cheated", 0) for mine in per.values())
    return {
        "mode": mode,
        "elapsed_s": round(elapsed_s, 1),
        "submissions": len(subs),
        "accepted_samples": accepted_samples,
        "trained_samples": trained_samples,
        "trained_cheated_samples": trained_cheated,
        "cheated_trained_fraction": trained_cheated / trained_samples if trained_samples else None,
        "cheated_submissions": cheated,
        "cheated_submissions_rejected": sum(mine.get("cheated_rejected", 0) for mine in per.values()),
        "honest_rejections": honest_rejections,
        "validator_audit_s": figures["audit_s"],
        "validator_audit_cpu_s": figures["audit_cpu_s"],
        "validator_samples_recomputed": figures["num_samples_verified"],
        "validator_s_per_accepted_sample": figures["audit_s"] / accepted_samples if accepted_samples else None,
        "validator_cpu_s_per_accepted_sample": (
            figures["audit_cpu_s"] / accepted_samples if accepted_samples else None
        ),
        "by_strategy": per,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from coordinator.config import ValidationConfig
    from coordinator.ledger.audit_policy import audit_policy, audit_summary

    args.dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for mode in ("full", "adaptive"):
        log(f"{mode} audit: {args.steps} steps, 2 honest and {len(CHEATERS)} cheating workers")
        runs[mode] = run_network(args.dir / mode, mode, args)
        log(f"{mode} audit: done in {runs[mode]['elapsed_s']} s")
    adaptive = ValidationConfig.model_validate(
        {
            "adaptive": {
                "enabled": True,
                "full_audit_results": args.full_audit_results,
                "floor": args.floor,
                "reaudit_share": args.reaudit_share,
            }
        }
    )
    bound = audit_summary(audit_policy(adaptive), "float32", args.prompts_per_task * args.group_size)
    full_cost, adaptive_cost = (runs[m]["validator_cpu_s_per_accepted_sample"] for m in ("full", "adaptive"))
    full_wall, adaptive_wall = (runs[m]["validator_s_per_accepted_sample"] for m in ("full", "adaptive"))
    summary = {
        "validator_cost_ratio": adaptive_cost / full_cost if full_cost and adaptive_cost is not None else None,
        "validator_wall_ratio": adaptive_wall / full_wall if full_wall and adaptive_wall is not None else None,
        "cheated_trained_fraction": runs["adaptive"]["cheated_trained_fraction"],
        "honest_rejections": runs["full"]["honest_rejections"] + runs["adaptive"]["honest_rejections"],
        "bound_cheated_fraction": bound.cheated_fraction_bound,
        # Every sample recomputed: the share of cheating submissions the proofs caught, this cheat's detection power
        # on this policy (a copied sample whose draws happen to be its own stream's is honest output, uncatchable).
        "copy_cheat_detection_full": (
            runs["full"]["cheated_submissions_rejected"] / runs["full"]["cheated_submissions"]
            if runs["full"]["cheated_submissions"]
            else None
        ),
    }
    print(
        json.dumps(
            {
                "summary": summary,
                "bound": bound.model_dump(exclude={"v"}),
                "runs": runs,
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
