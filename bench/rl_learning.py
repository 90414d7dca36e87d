"""The RL learning check: 100 GRPO steps of reverse_text from the early-SFT start checkpoint, per seed.

Trainer and the HF engine (engines/hf.py, through the Engine interface) run in one
process in a synchronous loop (trainer.rl.run_rl). The start checkpoint is
``builtin:tiny-qwen2-reverse-start`` (built on first use, about two minutes). The score is
the mean *sampled* reward (T = 1) on the task's fixed eval set, measured with the same noise
seed at every evaluation. Prints one JSON object; ``summary`` holds ``reward_start``,
``reward_end`` (means over seeds), ``reward_gain_min`` (the smallest end - start gain over the
seeds) and ``mismatch_kl_max`` (largest per-step KL between engine and trainer logprobs).

    python -m bench.rl_learning --threads 1   # 3 seeds x 100 steps, 1.5-4 min per seed on a busy 2-core CPU
    python -m bench.rl_learning --quick    # 1 seed x 10 steps, smaller batches: a smoke run, too short to learn
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def run_seed(args: argparse.Namespace, seed: int, start: Path, out_dir: Path) -> dict[str, Any]:
    from engines.base import GenerationRequest
    from engines.hf import HFEngine
    from trainer.config import RlConfig
    from trainer.rl import run_rl

    config = RlConfig(
        trainer={"model": str(start), "seed": seed, "optimizer": {"lr": args.lr}},
        environment={"type": "builtin", "name": "reverse_text"},
        output_dir=out_dir / f"seed{seed}",
        num_steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        max_tokens=32,
        temperature=1.0,
        eval_examples=args.eval_examples,
        eval_interval_steps=args.eval_interval,
    )
    engine = HFEngine(start, max_batch_size=256)
    started = time.perf_counter()
    result = run_rl(config, engine, GenerationRequest)
    elapsed = time.perf_counter() - started
    engine.close()
    curve = [[step, round(report.reward_mean, 4)] for step, report in result.evals]
    return {
        "seed": seed,
        "eval_reward_curve": curve,
        "eval_accuracy_curve": [[step, round(report.accuracy, 4)] for step, report in result.evals],
        "train_reward_per_step": [round(s["reward_mean"], 4) for s in result.steps],
        "reward_start": curve[0][1],
        "reward_end": curve[-1][1],
        "reward_gain": round(curve[-1][1] - curve[0][1], 4),
        "mismatch_kl_max": max(s["mismatch_kl"] for s in result.steps),
        "dropped_fraction_max": max(s["dropped_fraction"] for s in result.steps),
        "train_step_s_mean": sum(s["step_time_s"] for s in result.steps) / len(result.steps),
        "wall_s": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 10 steps, 16 prompts x 4 samples")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-examples", type=int, default=None)
    parser.add_argument("--eval-interval", type=int, default=None)
    parser.add_argument("--out-dir", type=Path, default=None, help="run files (default: a temporary dir)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's; 1 on a busy machine)"
    )
    args = parser.parse_args()
    quick = args.quick
    args.seeds = args.seeds or ([0] if quick else [0, 1, 2])
    args.steps = args.steps or (10 if quick else 100)
    args.prompts = args.prompts or (16 if quick else 32)
    args.group_size = args.group_size or (4 if quick else 8)
    args.eval_examples = args.eval_examples or (64 if quick else 256)
    args.eval_interval = args.eval_interval if args.eval_interval is not None else (5 if quick else 10)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from trainer.resolve import resolve_model_path

    start = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    with tempfile.TemporaryDirectory(prefix="rl-learning-") as tmp:
        out_dir = args.out_dir or Path(tmp)
        seeds = [run_seed(args, seed, start, out_dir) for seed in args.seeds]
    result = {
        "bench": "rl_learning",
        "quick": quick,
        "settings": {
            "task": "reverse_text",
            "start_checkpoint": "builtin:tiny-qwen2-reverse-start",
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "lr": args.lr,
            "temperature": 1.0,
            "eval_examples": args.eval_examples,
            "loss": "GRPO, token-level ratio, mask correction [0.8, 1.2], no std normalisation, no KL",
            "engine": "hf (engines/hf.py)",
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "seeds": seeds,
        "summary": {
            "reward_start": round(sum(s["reward_start"] for s in seeds) / len(seeds), 4),
            "reward_end": round(sum(s["reward_end"] for s in seeds) / len(seeds), 4),
            "reward_gain_min": min(s["reward_gain"] for s in seeds),
            "mismatch_kl_max": max(s["mismatch_kl_max"] for s in seeds),
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
