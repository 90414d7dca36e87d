"""Learning a reasoning-gym environment through the real network: SFT to a partial skill, then async RL.

For each seed: SFT the built-in tiny model (``builtin:tiny-qwen2``) on reference answers of one
reasoning-gym dataset (``spell_backward``: spell a short word backward) for a few steps, to a
partial-skill start; then ``prime-coordinator start`` with the orchestrator and a local network
(an HF worker and a validator as the coordinator's children, the trainer service) runs RL on
the same ``[environment]`` for ``--steps`` steps, every reward recomputed by the validator with
the dataset's own ``score_answer``. The sampled eval reward (``prime-trainer eval``'s report on
the environment's eval split) is measured on the SFT start and on the last published policy.

Prints one JSON object; ``summary``: ``env`` (the dataset), ``steps``, ``reward_gain_min``
(eval reward, last minus first, the smallest over seeds), ``score_ms_per_sample`` (what the
validator's scoring costs per sample: decoding excluded, the environment's ``score`` only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.runs import evaluate, run_coordinator
from runtime.ports import free_port

DATASET = "spell_backward"
ENVIRONMENT: dict[str, Any] = {
    "type": "reasoning_gym",
    "dataset": DATASET,
    "size": 100_000,
    "seed": 0,
    "args": {"min_word_len": 3, "max_word_len": 5},
}
"""Short words: the question and answer fit the tiny model's 256 positions with room to spare."""
MAX_TOKENS = 16


def log(message: str) -> None:
    print(f"[env_learning] {message}", file=sys.stderr, flush=True)


def sft(out_dir: Path, seed: int, steps: int) -> Path:
    from trainer.config import SftConfig
    from trainer.sft import run_sft

    config = SftConfig(
        model="builtin:tiny-qwen2",
        environment=ENVIRONMENT,
        output_dir=out_dir,
        num_steps=steps,
        batch_size=32,
        seed=seed,
        optimizer={"lr": 1e-3},
        resume=False,
        eval_examples=0,
    )
    return run_sft(config)


def rl(root: Path, start: Path, seed: int, steps: int, quick: bool, lr: float) -> Path:
    config = {
        "run_name": f"env-learning-{seed}",
        "data_dir": str(root / "run"),
        "environment": ENVIRONMENT,
        "api": {"host": "127.0.0.1", "port": free_port(), "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {"async_level": 1, "prompts_per_task": 4, "group_size": 8, "max_tokens": MAX_TOKENS},
        "trust": {"validators_open": True},
        "policy": {"start_checkpoint": str(start), "shard_size_bytes": 256 * 1024},
        "orchestrator": {
            "enabled": True,
            "num_steps": steps,
            "groups_per_step": 2 if quick else 4,
            "trainer_launch": {"nproc": 1},
            "progress_interval_s": 30,
            "trainer": {"seed": seed, "optimizer": {"lr": lr}},
        },
        "local_network": {"enabled": True, "engines": ["hf"], "num_validators": 1, "relay_enabled": False},
    }
    run_coordinator(root, config, f"seed {seed}: the RL run")
    # the trainer's exported step files go once published (retention); the origin store keeps the policy
    return root / "run" / "policies" / f"v{steps}" / "files"


def step_rewards(root: Path) -> list[dict[str, float]]:
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{root / 'run' / 'ledger.db'}")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT step, metrics_json FROM train_steps ORDER BY step")).all()
    engine.dispose()
    keep = ("batch_reward_mean", "batch_reward_mean/score_answer")
    return [{"step": int(step), **{k: v for k, v in json.loads(m or "{}").items() if k in keep}} for step, m in rows]


def score_cost(num_samples: int) -> float:
    """Milliseconds per ``score`` call of the environment (what each audited sample costs the validator)."""
    from pydantic import TypeAdapter

    from environments.config import EnvironmentConfig
    from environments.loader import load_environment

    environment = load_environment(TypeAdapter(EnvironmentConfig).validate_python(ENVIRONMENT))
    examples = [environment.example(i) for i in range(num_samples)]
    started = time.perf_counter()
    for example in examples:
        environment.score(example, (example.answer or "")[::-1])
    return (time.perf_counter() - started) * 1000 / num_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, 6 RL steps, a small eval")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per seed (default 60; quick 6)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 3; quick 1)")
    parser.add_argument("--sft-steps", type=int, default=150, help="SFT steps to the partial-skill start")
    parser.add_argument("--lr", type=float, default=1e-3, help="RL learning rate")
    parser.add_argument("--eval-examples", type=int, default=None, help="eval set size (default 256; quick 64)")
    parser.add_argument("--dir", type=Path, default=Path("runs/env-learning"))
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 60)
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    num_eval = args.eval_examples or (64 if args.quick else 256)
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    runs = []
    for seed in seeds:
        seed_dir = root / f"seed{seed}"
        seed_dir.mkdir(parents=True)
        started = time.monotonic()
        log(f"seed {seed}: SFT {args.sft_steps} steps")
        start = sft(seed_dir / "sft", seed, args.sft_steps)
        first = evaluate(start, ENVIRONMENT, num_eval, 1, MAX_TOKENS, seed)
        log(f"seed {seed}: start eval reward {first['reward_mean']:.3f}; RL {steps} steps through the network")
        final = rl(seed_dir, start, seed, steps, args.quick, args.lr)
        last = evaluate(final, ENVIRONMENT, num_eval, 1, MAX_TOKENS, seed)
        log(f"seed {seed}: final eval reward {last['reward_mean']:.3f}")
        runs.append(
            {
                "seed": seed,
                "eval_first": first,
                "eval_last": last,
                "reward_gain": last["reward_mean"] - first["reward_mean"],
                "steps": step_rewards(seed_dir),
                "total_s": time.monotonic() - started,
            }
        )
    summary = {
        "env": DATASET,
        "steps": steps,
        "reward_gain_min": min(run["reward_gain"] for run in runs),
        "score_ms_per_sample": score_cost(2000),
    }
    report = {"summary": summary, "environment": ENVIRONMENT, "sft_steps": args.sft_steps, "lr": args.lr, "runs": runs}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
