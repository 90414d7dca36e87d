"""Two RL steps on image samples with a checkpoint between them; run under torchrun (FSDP2) or in-process.

    torchrun --standalone --nproc-per-node 2 tests/unit/trainer/vision_probe.py MODEL_DIR OUT_DIR [--train-vision]

The batch is count_shapes prompts with their images and one text-only prompt, packed so that one
micro-batch shows no image and one rank gets a filler: both must still run the vision tower. Rank 0
writes ``metrics.json`` (both steps' metrics) and the policy after step 2 under ``OUT_DIR/policy``; the
trainer state after step 1 goes to ``OUT_DIR/ckpt``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from environments.builtin import builtin_environment
from environments.render import prompt_ids
from trainer.config import LossConfig, OptimizerConfig, TrainerSection
from trainer.train import Trainer
from trainer.transport import TrainSample

LOSS = LossConfig(correction="mask", mask_low=0.99, mask_high=100.0)


def image_samples(trainer: Trainer, seed: int, count: int = 4) -> list[TrainSample]:
    """``count`` count_shapes prompts with their images, and a reverse_text prompt without any; made-up completions
    (text, never image tokens), advantages and engine logprobs."""
    rng = random.Random(seed)
    shapes, reverse = builtin_environment("count_shapes"), builtin_environment("reverse_text")
    examples = [(shapes, shapes.example(seed * count + k)) for k in range(count)] + [(reverse, reverse.example(seed))]
    samples = []
    for environment, example in examples:
        prompt = prompt_ids(environment, example, trainer.tokenizer, trainer.vision)
        completion = trainer.tokenizer.encode(f"{rng.randint(1, 6)}\nno", add_special_tokens=False)
        logprobs = [-rng.uniform(0.5, 3) for _ in completion]
        samples.append(TrainSample(prompt, completion, rng.uniform(-1, 1), logprobs, images=example.images))
    return samples


def probe_section(model_dir: Path, freeze_vision: bool = True) -> TrainerSection:
    # Rows of two image samples at most, one micro-batch each: three micro-batches, the text-only one alone.
    return TrainerSection(
        model=str(model_dir),
        optimizer=OptimizerConfig(lr=1e-3, warmup_steps=1, schedule="linear"),
        packing={"micro_batch_tokens": 128, "row_tokens": 128},
        freeze_vision=freeze_vision,
    )


def run_probe(model_dir: Path, out_dir: Path, freeze_vision: bool = True) -> list[dict[str, Any]]:
    trainer = Trainer(probe_section(model_dir, freeze_vision), num_steps=4)
    first = trainer.rl_step(image_samples(trainer, 1), LOSS)
    trainer.save(out_dir / "ckpt")
    second = trainer.rl_step(image_samples(trainer, 2), LOSS)
    trainer.export(out_dir / "policy")
    metrics = [first, second]
    if trainer.info.is_main:
        (out_dir / "metrics.json").write_text(json.dumps({"world_size": trainer.info.world_size, "steps": metrics}))
    from trainer.fsdp import shutdown

    shutdown(trainer.info)
    return metrics


if __name__ == "__main__":
    run_probe(Path(sys.argv[1]), Path(sys.argv[2]), "--train-vision" not in sys.argv[3:])
