"""Learning under attack, and the training-safety contract against poisoned updates: one JSON object.

The learning bench's task, start and batch (``sort_digits`` from ``builtin:small-qwen3-sort-start``, the local
network's vLLM and HF workers, a 2-rank FSDP2 trainer, async level 1) with adaptive audit on, so the trainer
recomputes every behaviour log-probability and replays every trained token's draw. Per seed, five runs:

- ``clean``: the local network's workers and validator and two more honest workers;
- ``unfiltered``: the same with the no-signal filter off (what the filter saves is measured against it);
- ``attack``: a quarter of the workers cheating where adaptive audit looks least (one ``mixed`` cheater of
  :mod:`tests.support.cheating_worker` in place of an honest worker: forged log-probabilities, samples another
  policy drew, copied samples) and one more approved validator that accepts everything
  (:mod:`tests.support.lying_validator`), which wins most hand-outs: it answers first;
- ``poisoned``: a colluding quorum (two validators that accept everything, no honest one) and a worker that
  submits random tokens, which the colluders reward 1, 0, 1, 0 ...: poisoned batches reach the trainer;
- ``canary``: the colluding quorum flips every reward of a window of versions, a poison no check of the tokens
  sees; evals every 2 steps, and the canary rolls the run back when one falls.

Summary keys: ``gain_under_attack_over_clean`` (held-out accuracy gain of the attack run over the clean run's,
smallest over seeds; goal >= 0.9), ``poisoned_steps_applied`` (applied steps that trained a sample whose tokens the
policy did not draw: copied, another policy's where it differs from the policy's own draw, random; attack and
poisoned runs; goal 0), ``breaker_trips``
(refused attempts in the attack and poisoned runs), ``false_trips_clean`` (in the clean and unfiltered runs; goal
0), ``false_rollbacks_clean``, ``rollback_recovery_steps`` (canary runs: steps from the first step trained on
flipped rewards to the rollback's published step, mean over seeds), ``zero_signal_fraction`` (share of groups
without reward spread, unfiltered runs, before filtering) and ``filter_sample_ratio`` (verified samples the clean
run needed to reach the unfiltered run's final accuracy, over the samples the unfiltered run used in all; the
runs' own evals every 5 steps; mean over seeds; goal <= 0.8).

    python -m bench.poisoned_update             # 3 seeds x 5 runs of 30 steps (about 90 minutes on 2 cores)
    python -m bench.poisoned_update --quick     # 1 seed, 6 steps, the clean and attack runs: the pipeline only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.runs import REPO_ROOT, add_network_run_arguments, evaluate, network_run_config, run_plan
from runtime.children import stop_processes
from tests.support.coordinator_process import CoordinatorProcess

START = "builtin:small-qwen3-sort-start"
ENVIRONMENT: dict[str, Any] = {"type": "builtin", "name": "sort_digits"}
SCENARIOS = ("clean", "unfiltered", "attack", "poisoned", "canary")
RUN_TIMEOUT_S = 5400


def log(message: str) -> None:
    print(f"[poisoned_update] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 6 steps, clean and attack runs only")
    add_network_run_arguments(parser, max_tokens=16, trainer_ranks=2)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=None)
    parser.add_argument("--rate", type=float, default=0.5, help="the mixed cheater's share of cheated tasks")
    parser.add_argument("--flip", default="10:15", help="canary runs: the versions whose rewards are flipped")
    parser.add_argument("--eval-examples", type=int, default=None, help="held-out prompts (default 256; quick 64)")
    parser.add_argument("--eval-samples", type=int, default=4, help="samples of each held-out prompt")
    parser.add_argument("--dir", type=Path, default=Path("runs/poisoned-update"))
    args = parser.parse_args(argv)
    if args.quick and args.steps is None:
        args.steps = 6
    args.scenarios = args.scenarios or (["clean", "attack"] if args.quick else list(SCENARIOS))
    args.engines = ["vllm", "hf"]
    return args


def run_config(root: Path, scenario: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from trainer.resolve import resolve_model_path

    config = network_run_config(f"poisoned-{scenario}-{seed}", root, resolve_model_path(START), ENVIRONMENT, seed, args)
    config["validation"] = {"adaptive": {"enabled": True}}
    config["trust"]["ban_after_rejections"] = 3
    orchestrator = config["orchestrator"]
    orchestrator.update({"steps_ahead": 1, "eval_every_steps": 5, "eval_num_examples": args.eval_examples or 256})
    if scenario == "unfiltered":
        orchestrator["no_signal_filter"] = False
    if scenario in ("poisoned", "canary"):  # the colluding quorum is every validator there is
        config["local_network"]["num_validators"] = 0
        config["validation"]["validators_per_submission"] = 2
    if scenario == "canary":
        orchestrator["eval_every_steps"] = 2
    return config


def _popen(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=out, env=env)


def adversaries(root: Path, scenario: str, url: str, seed: int, args: argparse.Namespace) -> list[list[str]]:
    """The extra workers and validators of a scenario, as commands (data dirs under ``root``)."""
    python = sys.executable

    def worker(name: str, strategy: str) -> list[str]:
        command = [python, "-m", "tests.support.cheating_worker", url, str(root / "workers" / name), strategy]
        return [*command, "--record-tasks", "0", "--rate", str(args.rate), "--seed", str(seed), "--log-undrawn"]

    def liar(name: str, *flags: str) -> list[str]:
        return [python, "-m", "tests.support.lying_validator", url, str(root / "validators" / name), *flags]

    if scenario in ("clean", "unfiltered"):
        return [worker("honest", "honest"), worker("honest2", "honest")]
    if scenario == "attack":
        return [worker("honest", "honest"), worker("cheater", "mixed"), liar("liar")]
    poisoner = node_id_of(root / "workers" / "poisoner")
    flags = ["--favour", poisoner] if scenario == "poisoned" else ["--flip-versions", args.flip]
    extra = [worker("poisoner", "garbage")] if scenario == "poisoned" else []
    return [*extra, liar("liar", *flags), liar("liar2", *flags)]


def node_id_of(data_dir: Path) -> str:
    from protocol.identity import load_or_create_identity

    data_dir.mkdir(parents=True, exist_ok=True)
    return load_or_create_identity(data_dir).node_id


def run_network(root: Path, scenario: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run to its end with the scenario's extra nodes beside it; what its ledger says (:func:`measure`)."""
    import tomli_w

    root.mkdir(parents=True, exist_ok=True)
    config = run_config(root, scenario, seed, args)
    (root / "run.toml").write_text(tomli_w.dumps(config))
    url = f"http://127.0.0.1:{config['api']['port']}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    log_path = root / "coordinator.log"
    coordinator = CoordinatorProcess(root / "run.toml", log_path, env, stdout_path=log_path)
    nodes: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        coordinator.start(url, timeout_s=600)
        for index, command in enumerate(adversaries(root, scenario, url, seed, args)):
            nodes.append(_popen(command, root / "logs" / f"node{index}.log", env))
        assert coordinator.proc is not None
        rc = coordinator.proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        coordinator.stop()
        stop_processes(nodes)
    if rc != 0:
        raise SystemExit(f"the {scenario} run failed (exit {rc}); see {log_path}")
    return {"scenario": scenario, "elapsed_s": round(time.monotonic() - started, 1), **measure(root, config)}


def _undrawn(root: Path) -> set[tuple[str, str]]:
    """(node id, sample uid) of every cheated sample whose tokens the policy did not draw, from every cheating
    worker's log (a sample another policy drew is often the policy's own draw too: that one is no poison)."""
    found: set[tuple[str, str]] = set()
    for path in (root / "workers").glob("*/cheats.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            found.update((entry["node_id"], uid) for uid in entry.get("undrawn", []))
    return found


def measure(root: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The run's steps (kind, trips, figures), evals, the trained samples the policy did not draw, and catches."""
    from coordinator.config import CoordinatorConfig
    from coordinator.ledger.export import rollout_rows
    from coordinator.loop.metrics_export import metrics_rows
    from coordinator.serving.server import open_ledger
    from environments.prompts import NoPrompts

    loaded = CoordinatorConfig.model_validate(config)
    database, ledger = open_ledger(loaded, NoPrompts(), "bench")
    try:
        records = ledger.train_steps.steps()
        rows = metrics_rows(database)
        trained = list(rollout_rows(database, 1, -1, loaded.archive_dir, False))
        events = ledger.events(0, 100_000).events
    finally:
        database.dispose()
    undrawn = _undrawn(root)
    applied = {r.step for r in records if r.kind == "train" and r.state == "published"}
    poisoned = {
        row["step"]
        for row in trained
        if row["step"] in applied
        and row["advantage"] != 0  # a group without signal is not trained
        and (row["node_id"], f"{row['task_id']}/{row['prompt_index']}/{row['sample_index']}") in undrawn
    }
    steps = [row for row in rows if row["kind"] == "step"]
    return {
        "breaker_trips": sum(len(r.trips) for r in records),
        "skipped_steps": sum(r.kind == "skip" for r in records),
        "rollbacks": [(r.step, r.restore_version) for r in records if r.kind == "restore"],
        "poisoned_steps_applied": sorted(poisoned),
        "caught_by_trainer": sum(1 for e in events if e.kind == "reaudit" and e.data.get("caught_by") == "trainer"),
        "reaudit_catches": sum(1 for e in events if e.kind == "reaudit" and e.data.get("passed") is False),
        "bans": sum(1 for e in events if e.kind == "ban"),
        "evals": {row["step"]: row.get("eval_accuracy") for row in rows if row["kind"] == "eval"},
        "steps": [
            {
                key: row.get(key)
                for key in (
                    "step",
                    "step_kind",
                    "breaker_trips",
                    "batch_num_samples",
                    "batch_num_set_aside",
                    "batch_zero_signal_fraction",
                    "grad_norm",
                    "mismatch_kl",
                    "out_of_band_fraction",
                )
            }
            for row in steps
        ],
        "final_policy": str(root / "run" / "final-policy"),
    }


def samples_to_reach(run: dict[str, Any], target: float, per_submission: int) -> float | None:
    """Verified samples a run used (its steps' groups and those set aside for them) up to its first eval at or
    above ``target``; None when no eval reaches it."""
    reached = [step for step, accuracy in sorted(run["evals"].items()) if accuracy is not None and accuracy >= target]
    if not reached:
        return None
    return sum(
        (s["batch_num_samples"] or 0) + (s["batch_num_set_aside"] or 0) * per_submission
        for s in run["steps"]
        if s["step"] <= reached[0]
    )


def recovery_steps(run: dict[str, Any], flip: str) -> int | None:
    """Steps from the first step trained on flipped rewards (it trains the flip window's first version) to the
    first rollback published after it; None without one."""
    first = int(flip.split(":")[0]) + 1
    after = [step for step, _ in run["rollbacks"] if step > first]
    return after[0] - first if after else None


def summarise(start: float, runs: dict[int, dict[str, dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    def gain(run: dict[str, Any]) -> float:
        return float(run["eval"]["accuracy"]) - start

    per_submission = args.prompts_per_task * args.group_size
    seeds = list(runs.values())
    summary: dict[str, Any] = {}
    if all("attack" in s and "clean" in s for s in seeds):
        summary["gain_under_attack_over_clean"] = min(gain(s["attack"]) / gain(s["clean"]) for s in seeds)
    hostile = [run for s in seeds for name, run in s.items() if name in ("attack", "poisoned")]
    summary["poisoned_steps_applied"] = sum(len(run["poisoned_steps_applied"]) for run in hostile)
    summary["breaker_trips"] = sum(run["breaker_trips"] for run in hostile)
    clean = [run for s in seeds for name, run in s.items() if name in ("clean", "unfiltered")]
    summary["false_trips_clean"] = sum(run["breaker_trips"] for run in clean)
    summary["false_rollbacks_clean"] = sum(len(run["rollbacks"]) for run in clean)
    recoveries = [recovery_steps(s["canary"], args.flip) for s in seeds if "canary" in s]
    if recoveries:
        found = [r for r in recoveries if r is not None]
        summary["rollback_recovery_steps"] = statistics.mean(found) if found else None
        summary["canary_runs_rolled_back"] = len(found)
    unfiltered = [s["unfiltered"] for s in seeds if "unfiltered" in s]
    if unfiltered:
        fractions = [step["batch_zero_signal_fraction"] for run in unfiltered for step in run["steps"]]
        summary["zero_signal_fraction"] = statistics.mean(f for f in fractions if f is not None)
        ratios: list[float | None] = []
        for s in seeds:
            target = s["unfiltered"]["evals"].get(args.steps)
            if target is None or "clean" not in s:
                continue
            needed = samples_to_reach(s["clean"], target, per_submission)
            without = samples_to_reach(s["unfiltered"], target, per_submission)
            ratios.append(None if needed is None or not without else needed / without)
        reached = [r for r in ratios if r is not None]
        summary["filter_sample_ratio"] = statistics.mean(reached) if reached and len(reached) == len(ratios) else None
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seeds, num_eval = run_plan(args, quick_eval=64)
    from trainer.resolve import resolve_model_path

    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    start = evaluate(resolve_model_path(START), ENVIRONMENT, num_eval, args.eval_samples, args.max_tokens)
    log(f"start: accuracy {start['accuracy']:.3f}")
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in seeds:
        for scenario in args.scenarios:
            log(f"seed {seed}: the {scenario} run, {args.steps} steps")
            run = run_network(root / f"seed{seed}" / scenario, scenario, seed, args)
            run["eval"] = evaluate(Path(run["final_policy"]), ENVIRONMENT, num_eval, args.eval_samples, args.max_tokens)
            log(f"seed {seed}, {scenario}: accuracy {run['eval']['accuracy']:.3f}, trips {run['breaker_trips']}")
            runs.setdefault(seed, {})[scenario] = run
    summary = summarise(float(start["accuracy"]), runs, args)
    print(json.dumps({"summary": summary, "start": start, "runs": runs, "args": vars_of(args)}, default=str))


def vars_of(args: argparse.Namespace) -> dict[str, Any]:
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


if __name__ == "__main__":
    main()
