"""How long the built-in arithmetic start takes to build, and what it can do: room to learn, or not.

    python -m bench.builtin_start            # the shipped recipe (1000 SFT steps), 256 held-out problems x 8
    python -m bench.builtin_start --quick    # a 40-step recipe, 32 problems x 4: the pipeline, in about a minute

Builds ``builtin:small-qwen3-arithmetic-start`` into a fresh cache (timed), then samples it at T = 1 with
the project's verifiable sampler on the arithmetic environment's held-out eval stream. Prints one JSON
object whose ``summary`` holds ``build_s``, ``accuracy`` (exact answers per sample), ``stop_fraction`` and,
from the bounds the start is made for, ``in_partial_range`` (accuracy between 0.03 and 0.5, stop fraction
at least 0.95).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

MIN_ACCURACY = 0.03
MAX_ACCURACY = 0.5
MIN_STOP_FRACTION = 0.95


def measure(quick: bool, num_threads: int) -> dict[str, Any]:
    import torch

    import trainer.resolve
    from engines.base import GenerationRequest
    from engines.hf import HFEngine
    from environments.builtin import builtin_environment
    from trainer.model import load_tokenizer
    from trainer.resolve import resolve_model_path
    from trainer.rollout import RolloutSampler
    from trainer.start import ARITHMETIC_RECIPE, StartRecipe

    torch.set_num_threads(num_threads)
    recipe = StartRecipe(environment="arithmetic", num_steps=40, batch_size=32, lr=2e-3) if quick else ARITHMETIC_RECIPE
    trainer.resolve.STARTS["small-qwen3-arithmetic-start"] = ("small-qwen3", recipe)
    num_problems, num_samples = (32, 4) if quick else (256, 8)
    with tempfile.TemporaryDirectory(prefix="builtin-start-") as cache:
        started = time.monotonic()
        start = resolve_model_path("builtin:small-qwen3-arithmetic-start", Path(cache))
        build_s = time.monotonic() - started
        engine = HFEngine(start, max_batch_size=256)
        try:
            sampler = RolloutSampler(
                engine, GenerationRequest, builtin_environment("arithmetic"), load_tokenizer(str(start)), 1.0, 8
            )
            report = sampler.evaluate(num_problems, num_samples=num_samples, seed=0)
        finally:
            engine.close()
    in_range = MIN_ACCURACY <= report.accuracy <= MAX_ACCURACY and report.stop_fraction >= MIN_STOP_FRACTION
    return {
        "summary": {
            "build_s": round(build_s, 1),
            "accuracy": round(report.accuracy, 4),
            "stop_fraction": round(report.stop_fraction, 4),
            "in_partial_range": in_range,
        },
        "recipe": {"num_steps": recipe.num_steps, "batch_size": recipe.batch_size, "lr": recipe.lr},
        "eval": {"problems": num_problems, "samples_per_problem": num_samples, "temperature": 1.0, "max_tokens": 8},
        "num_threads": num_threads,
        "quick": quick,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short recipe and a small eval: the pipeline only")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    print(json.dumps(measure(args.quick, args.threads)))


if __name__ == "__main__":
    main()
