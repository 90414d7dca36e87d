"""Learning through the whole network, side by side with TRL's ``GRPOTrainer``: held-out exact answers.

For each seed, three runs from the same start checkpoint (``builtin:small-qwen3-sort-start``, an
early SFT of the built-in small Qwen3 on ``sort_digits``), on the same task, with the same prompts
per step, group size, learning rate (Adam, a short linear warm-up, then constant), token-level loss normalisation,
no KL term, sampling temperature, token budget and number of steps:

- **network, async level 1**: ``prime-coordinator start`` with the RL loop and the local network
  (a relay, a vLLM and an HF worker, a validator, a 2-rank torchrun FSDP2 trainer); every rollout
  is proved by its worker and checked by the validator before the trainer learns from it;
- **network, async level 0**: the same, each step waiting for the policy of the step before;
- **TRL**: ``GRPOTrainer`` (TRL pinned in the bench's own venv, ``.bench-venv-trl/``, created on
  first use and never touching ``.venv``) in one process: HF generation and training, nothing
  verified (:mod:`bench.trl_grpo`).

Each final policy and the start are evaluated by one evaluator (this project's HF sampler at
T = 1, ``--eval-samples`` samples of each of ``--eval-examples`` held-out prompts that no training
index can produce), scored by exact answer.

Prints one JSON object; ``summary``: ``accuracy_start``, ``accuracy_network`` (async level 1),
``accuracy_network_sync`` (level 0) and ``accuracy_trl`` (means over seeds); ``accuracy_gain_min``
(the network's gain, smallest over seeds); ``gain_over_trl`` (mean network gain / mean TRL gain);
``stop_fraction_end`` (the network's final policy) and ``stop_fraction_start``; ``wall_over_trl``
(the network's wall time from its process start to its last step's publication, over TRL's from its
process start to its last step, same machine, run one after the other; ``loop_wall_over_trl`` the
same from the first step's start); ``steps``. Each run's step times say where a step's time goes.

    python -m bench.learning_vs_trl                 # 3 seeds x (2 network runs + TRL), 30 steps each
    python -m bench.learning_vs_trl --quick         # 1 seed, 4 steps, small eval: the pipeline only
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.runs import REPO_ROOT, add_network_run_arguments, evaluate, network_run_config, run_coordinator, run_plan
from bench.venvs import reference_venv

START = "builtin:small-qwen3-sort-start"
ENVIRONMENT: dict[str, Any] = {"type": "builtin", "name": "sort_digits"}
TRL_VERSION = "1.16.0"
TRL_REQUIREMENTS = (f"trl=={TRL_VERSION}",)
"""TRL brings its own transformers and datasets; torch and transformers are pinned to the project's below."""


def log(message: str) -> None:
    print(f"[learning_vs_trl] {message}", file=sys.stderr, flush=True)


def pinned(package: str) -> str:
    from importlib.metadata import version

    return f"{package}=={version(package)}"


def trl_venv(venv: Path) -> Path:
    """The bench venv with TRL, on the same torch and transformers as the project (created on first use)."""
    packages = [pinned("torch"), pinned("transformers"), *TRL_REQUIREMENTS]
    return reference_venv(venv, "trl", TRL_VERSION, packages, log)


def network_config(root: Path, start: Path, seed: int, args: argparse.Namespace, level: int) -> dict[str, Any]:
    config = network_run_config(f"learning-vs-trl-{seed}-level{level}", root, start, ENVIRONMENT, seed, args)
    config["scheduling"]["async_level"] = level
    config["validation"] = {"audit_fraction": args.audit_fraction}
    config["orchestrator"]["steps_ahead"] = args.steps_ahead
    return config


def step_times(root: Path) -> list[dict[str, Any]]:
    """Each step's ledger times (recorded, trained, published), reward and the trainer's own phase times, from the
    run's SQLite ledger."""
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{root / 'run' / 'ledger.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT step, recorded_at, trained_at, published_at, metrics_json FROM train_steps ORDER BY step")
        ).all()
    engine.dispose()
    steps: list[dict[str, Any]] = []
    for step, recorded, trained, published, metrics in rows:
        figures = json.loads(metrics or "{}")
        steps.append(
            {
                "step": int(step),
                "recorded_at": recorded,
                "trained_at": trained,
                "published_at": published,
                **{key: figures.get(key) for key in ("batch_reward_mean", *TRAINER_PHASES)},
            }
        )
    return steps


def run_network(root: Path, start: Path, seed: int, args: argparse.Namespace, level: int) -> dict[str, Any]:
    root.mkdir(parents=True)
    started = time.time()
    run_coordinator(root, network_config(root, start, seed, args, level), "the network run")
    steps = step_times(root)
    published = [s["published_at"] for s in steps if s["published_at"] is not None]
    first = min(s["recorded_at"] for s in steps)
    return {
        "final_policy": str(root / "run" / "final-policy"),
        "process_to_last_step_s": max(published) - started,
        "start_up_s": first - started,
        "loop_to_last_step_s": max(published) - first,
        "step_phases_s": step_phases(steps),
        "steps": steps,
    }


TRAINER_PHASES = ("step_time_s", "export_s", "checkpoint_s")
"""The trainer's own times of a step: the optimizer step, writing the policy, saving the checkpoint."""


def step_phases(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Where a step's time goes, mean seconds: waiting for its batch after the step before was published
    (generation and validation not hidden by the overlap), training (split by the trainer into the optimizer
    step, the policy export and the checkpoint), publishing (patch, signature, SHARDCAST)."""
    done = [s for s in steps if s["trained_at"] is not None and s["published_at"] is not None]
    waits = [b["recorded_at"] - a["published_at"] for a, b in itertools.pairwise(done)]
    phases = {
        "batch_wait": round(statistics.mean(max(0.0, w) for w in waits), 3) if waits else 0.0,
        "train": round(statistics.mean(s["trained_at"] - s["recorded_at"] for s in done), 3) if done else 0.0,
        "publish": round(statistics.mean(s["published_at"] - s["trained_at"] for s in done), 3) if done else 0.0,
    }
    for key in TRAINER_PHASES:
        times = [s[key] for s in done if s.get(key) is not None]
        if times:
            phases[f"train_{key.removesuffix('_s')}"] = round(statistics.mean(times), 3)
    return phases


def run_trl(root: Path, python: Path, start: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from environments.config import BuiltinEnvConfig
    from environments.loader import load_environment
    from environments.render import prompt_text
    from node.startup import eos_token_ids
    from trainer.model import load_tokenizer

    root.mkdir(parents=True)
    environment = load_environment(BuiltinEnvConfig.model_validate(ENVIRONMENT))
    tokenizer = load_tokenizer(str(start))
    prompts_per_step = args.prompts_per_task * args.groups_per_step
    examples = [environment.example(i) for i in range(prompts_per_step * args.steps)]
    spec = {
        "model": str(start),
        "prompts": [prompt_text(environment, example, tokenizer) for example in examples],
        "answers": [example.answer for example in examples],
        "eos_token_ids": list(eos_token_ids(start)),
        "seed": seed,
        "steps": args.steps,
        "prompts_per_step": prompts_per_step,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "lr": args.lr,
        "warmup_steps": args.warmup_steps,
        "threads": args.trl_threads,
    }
    (root / "spec.json").write_text(json.dumps(spec))
    with (root / "trl.log").open("wb") as out:
        done = subprocess.run(
            [str(python), str(REPO_ROOT / "bench" / "trl_grpo.py"), str(root / "spec.json"), str(root)],
            stdout=out,
            stderr=out,
            cwd=root,
            timeout=7200,
        )
    if done.returncode != 0:
        raise SystemExit(f"the TRL run failed (exit {done.returncode}); see {root / 'trl.log'}")
    report: dict[str, Any] = json.loads((root / "trl.json").read_text())
    return {"final_policy": str(root / "policy"), **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps, 64 eval prompts: the pipeline only")
    add_network_run_arguments(parser, max_tokens=16, trainer_ranks=2)
    parser.add_argument("--audit-fraction", type=float, default=1.0, help="validation.audit_fraction")
    parser.add_argument(
        "--steps-ahead", type=int, default=1, help="orchestrator.steps_ahead: workers and trainer share the cores"
    )
    parser.add_argument("--engines", nargs="+", default=["vllm", "hf"], help="the local network's workers")
    parser.add_argument("--eval-examples", type=int, default=None, help="held-out prompts (default 256; quick 64)")
    parser.add_argument("--eval-samples", type=int, default=4, help="samples of each held-out prompt")
    parser.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--skip-trl", action="store_true", help="the network only (no reference figures)")
    parser.add_argument("--bench-venv", type=Path, default=REPO_ROOT / ".bench-venv-trl")
    parser.add_argument("--dir", type=Path, default=Path("runs/learning-vs-trl"))
    args = parser.parse_args()
    seeds, num_eval = run_plan(args, quick_eval=64)

    from trainer.resolve import resolve_model_path

    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    python = None if args.skip_trl else trl_venv(args.bench_venv)
    start = resolve_model_path(START)

    def score(model: Path) -> dict[str, Any]:
        return evaluate(model, ENVIRONMENT, num_eval, args.eval_samples, args.max_tokens)

    first = score(start)
    log(f"start: accuracy {first['accuracy']:.3f}, stop fraction {first['stop_fraction']:.3f}")
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        run: dict[str, Any] = {"seed": seed}
        for level in (1, 0):
            log(f"seed {seed}: {args.steps} steps through the network at async level {level}")
            network = run_network(root / f"seed{seed}" / f"level{level}", start, seed, args, level)
            network["eval"] = score(Path(network["final_policy"]))
            log(f"seed {seed}, level {level}: accuracy {network['eval']['accuracy']:.3f}")
            run[f"network_level{level}"] = network
        if python is not None:
            log(f"seed {seed}: {args.steps} steps of TRL's GRPOTrainer")
            trl = run_trl(root / f"seed{seed}" / "trl", python, start, seed, args)
            trl["eval"] = score(Path(trl["final_policy"]))
            log(f"seed {seed}, TRL: accuracy {trl['eval']['accuracy']:.3f}")
            run["trl"] = trl
        runs.append(run)
    print(json.dumps({"summary": summarise(first, runs, args.steps), "start": first, "runs": runs, **vars_of(args)}))


def summarise(first: dict[str, Any], runs: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    def accuracy(run: dict[str, Any], side: str) -> float:
        return float(run[side]["eval"]["accuracy"])

    start = float(first["accuracy"])
    network = [accuracy(run, "network_level1") for run in runs]
    summary: dict[str, Any] = {
        "accuracy_start": round(start, 4),
        "accuracy_network": round(statistics.mean(network), 4),
        "accuracy_network_sync": round(statistics.mean(accuracy(run, "network_level0") for run in runs), 4),
        "accuracy_gain_min": round(min(network) - start, 4),
        "stop_fraction_start": first["stop_fraction"],
        "stop_fraction_end": round(statistics.mean(run["network_level1"]["eval"]["stop_fraction"] for run in runs), 4),
        "steps": steps,
    }
    if all("trl" in run for run in runs):
        trl = [accuracy(run, "trl") for run in runs]
        trl_gain = statistics.mean(trl) - start
        summary["accuracy_trl"] = round(statistics.mean(trl), 4)
        summary["gain_over_trl"] = round((statistics.mean(network) - start) / trl_gain, 4) if trl_gain > 0 else None
        walls = [run["network_level1"]["process_to_last_step_s"] / run["trl"]["process_to_last_step_s"] for run in runs]
        loops = [run["network_level1"]["loop_to_last_step_s"] / run["trl"]["train_to_last_step_s"] for run in runs]
        summary["wall_over_trl"] = round(statistics.mean(walls), 4)
        summary["loop_wall_over_trl"] = round(statistics.mean(loops), 4)
    return summary


def vars_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}


if __name__ == "__main__":
    main()
