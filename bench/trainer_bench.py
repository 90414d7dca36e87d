"""Training throughput: tokens/s with and without sequence packing, on the tiny model and a ~50M config.

One process, fp32, CPU (or the GPU when there is one). The batch imitates RL rollouts:
reverse_text prompts with completions of random length (1-64 tokens of random ids), so
lengths vary the way sampled completions do. "Packed" is the trainer's default packing
(rows of at most ``row_tokens`` samples with block-causal masks); "padded" puts one sample
per row, padded to the longest of its micro-batch (what a plain HF loop does). Throughput
counts real (non-padding) tokens per second of a full optimizer step (forward, backward,
clip, AdamW), median over the measured steps after one warm-up step. Both modes run in the
same process with their steps interleaved (packed, padded, packed, ...), so a shared
machine's load drifts hit both; ``packing_speedup`` is their ratio on the tiny model.

    python -m bench.trainer_bench [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def make_batch(tokenizer: Any, num_samples: int, seed: int) -> list[Any]:
    from environments.builtin import builtin_environment
    from trainer.transport import TrainSample

    rng = random.Random(seed)
    task = builtin_environment("reverse_text")
    vocab = len(tokenizer)
    batch = []
    for i in range(num_samples):
        prompt = tokenizer.encode(task.example(i).prompt, add_special_tokens=False)
        completion = [rng.randrange(vocab) for _ in range(rng.randint(1, 64))]
        batch.append(TrainSample(prompt_ids=list(prompt), completion_ids=completion))
    return batch


def measure_pair(model_dir: Path, num_samples: int, num_steps: int) -> dict[str, dict[str, Any]]:
    """Packed and padded trainers on the same batch, their steps interleaved so load drifts hit both alike."""
    from trainer.config import TrainerSection
    from trainer.train import Trainer

    trainers = {
        mode: Trainer(
            TrainerSection(model=str(model_dir), packing={"enabled": mode == "packed", "micro_batch_tokens": 4096}),
            num_steps=num_steps + 1,
        )
        for mode in ("packed", "padded")
    }
    batch = make_batch(trainers["packed"].tokenizer, num_samples, seed=0)
    records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in trainers}
    for trainer in trainers.values():
        trainer.sft_step(batch)  # warm-up
    for _ in range(num_steps):
        for mode, trainer in trainers.items():
            records[mode].append(trainer.sft_step(batch))
    real_tokens = sum(s.num_tokens for s in batch)
    return {
        mode: {
            "num_samples": num_samples,
            "real_tokens_per_step": real_tokens,
            "micro_batches": steps[-1]["num_micro_batches"],
            "step_s": [round(r["step_time_s"], 4) for r in steps],
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in steps), 1),
        }
        for mode, steps in records.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples and steps")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's; 1 on a busy machine)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer

    from trainer.builtin import build_random_qwen2
    from trainer.resolve import resolve_model_path

    tiny = resolve_model_path("builtin:tiny-qwen2")
    tiny_samples, tiny_steps = (128, 3) if args.quick else (256, 8)
    big_samples, big_steps = (4, 1) if args.quick else (16, 3)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        big = Path(tmp) / "qwen2-50m"
        build_random_qwen2(big, "50m", Tokenizer.from_file(str(tiny / "tokenizer.json")))
        from trainer.model import load_model

        num_params = {
            "tiny": sum(p.numel() for p in load_model(str(tiny)).parameters()),
            "50m": sum(p.numel() for p in load_model(str(big)).parameters()),
        }
        for name, path, samples, steps in (
            ("tiny", tiny, tiny_samples, tiny_steps),
            ("50m", big, big_samples, big_steps),
        ):
            for mode, figures in measure_pair(path, samples, steps).items():
                runs[f"{name}_{mode}"] = figures
    result = {
        "bench": "trainer_bench",
        "quick": args.quick,
        "num_params": num_params,
        "runs": runs,
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "summary": {
            "packing_speedup": round(runs["tiny_packed"]["tokens_per_s"] / runs["tiny_padded"]["tokens_per_s"], 3),
            "packing_speedup_50m": round(runs["50m_packed"]["tokens_per_s"] / runs["50m_padded"]["tokens_per_s"], 3),
            "tokens_per_s_tiny": runs["tiny_packed"]["tokens_per_s"],
            "tokens_per_s_50m": runs["50m_packed"]["tokens_per_s"],
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
