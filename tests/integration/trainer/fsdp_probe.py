"""Two RL steps with a checkpoint between them; run under torchrun (FSDP2) or in-process (one rank).

    torchrun --standalone --nproc-per-node 2 tests/integration/trainer/fsdp_probe.py MODEL_DIR OUT_DIR [--ac]
    torchrun ... fsdp_probe.py MODEL_DIR OUT_DIR --resume   # step 2 again from OUT_DIR/ckpt
    torchrun ... fsdp_probe.py MODEL_DIR OUT_DIR --lora [--resume]   # the same with LoRA adapters
    torchrun ... fsdp_probe.py MODEL_DIR OUT_DIR --contract [--resume]   # behaviour recompute, breakers, restore


Rank 0 writes ``metrics.json`` (both steps' metrics) and the policy after step 2 under
``OUT_DIR/policy`` (with LoRA: the adapter, and the merged model under ``OUT_DIR/merged``); the
trainer state after step 1 goes to ``OUT_DIR/ckpt``.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from environments.builtin import builtin_environment
from trainer.config import BreakerConfig, LoraConfig, LossConfig, OptimizerConfig, ParallelConfig, TrainerSection
from trainer.train import Trainer
from trainer.transport import TrainSample

LOSS = LossConfig(correction="mask", mask_low=0.99, mask_high=100.0)


def probe_batch(trainer: Trainer, seed: int) -> list[TrainSample]:
    """A fixed RL batch: reverse_text pairs with made-up advantages and engine logprobs."""
    from trainer.sft import sft_batch

    rng = random.Random(seed)
    return [
        TrainSample(
            s.prompt_ids, s.completion_ids, rng.uniform(-1, 1), [-rng.uniform(0.5, 3) for _ in s.completion_ids]
        )
        for s in sft_batch(builtin_environment("reverse_text"), trainer.tokenizer, seed, 24)
    ]


def probe_section(model_dir: Path, activation_checkpointing: bool = False, lora: bool = False) -> TrainerSection:
    # Small rows and micro-batches: several micro-batches per rank, so accumulation is exercised.
    return TrainerSection(
        model=str(model_dir),
        optimizer=OptimizerConfig(lr=1e-2 if lora else 1e-3, warmup_steps=1, schedule="linear"),
        parallel=ParallelConfig(activation_checkpointing=activation_checkpointing),
        packing={"micro_batch_tokens": 128, "row_tokens": 64},
        lora=LoraConfig(enabled=lora, rank=4, alpha=8),
    )


def run_probe(
    model_dir: Path, out_dir: Path, activation_checkpointing: bool = False, lora: bool = False
) -> list[dict[str, Any]]:
    trainer = Trainer(probe_section(model_dir, activation_checkpointing, lora), num_steps=4)
    first = trainer.rl_step(probe_batch(trainer, 1), LOSS)
    trainer.save(out_dir / "ckpt")
    second = trainer.rl_step(probe_batch(trainer, 2), LOSS)
    trainer.export(out_dir / "policy")
    if lora:
        trainer.export_merged(out_dir / "merged")
    metrics = [first, second]
    if trainer.info.is_main:
        (out_dir / "metrics.json").write_text(json.dumps({"world_size": trainer.info.world_size, "steps": metrics}))
    from trainer.fsdp import shutdown

    shutdown(trainer.info)
    return metrics


def resume_probe(model_dir: Path, out_dir: Path, lora: bool = False) -> dict[str, Any]:
    """Resume from ``out_dir/ckpt`` and take step 2 again (rank 0 writes ``resumed.json``)."""
    trainer = Trainer(probe_section(model_dir, lora=lora), num_steps=4)
    assert trainer.resume(out_dir / "ckpt")
    again = trainer.rl_step(probe_batch(trainer, 2), LOSS)
    if trainer.info.is_main:
        (out_dir / "resumed.json").write_text(json.dumps(again))
    from trainer.fsdp import shutdown

    shutdown(trainer.info)
    return again


RECOMPUTE = LossConfig(behaviour_logprobs="recompute")


def versioned(samples: list[TrainSample], version: int, advantage_scale: float = 1.0) -> list[TrainSample]:
    return [replace(s, policy_version=version, advantage=s.advantage * advantage_scale) for s in samples]


def contract_probe(model_dir: Path, out_dir: Path, resume: bool = False) -> list[dict[str, Any]]:
    """The training-safety contract on any number of ranks: behaviour log-probabilities recomputed from the kept
    versions (a stale batch), an update a breaker refuses, a restore of an exported version, a step after it; the
    state is saved before the restore. ``resume``: from that state, the restore and the step after it again. Rank 0
    writes ``contract.json`` (or ``contract_resumed.json``)."""
    trainer = Trainer(probe_section(model_dir), num_steps=6)
    trainer.keep_behaviour(2)
    breakers = BreakerConfig()
    metrics: list[dict[str, Any]] = []
    if resume:
        assert trainer.resume(out_dir / "ckpt")
    else:
        metrics.append(trainer.rl_step(versioned(probe_batch(trainer, 1), 0), RECOMPUTE, breakers=breakers))
        trainer.export(out_dir / "v1")
        metrics.append(trainer.rl_step(versioned(probe_batch(trainer, 2), 0), RECOMPUTE, breakers=breakers))
        poisoned = versioned(probe_batch(trainer, 3), 2, advantage_scale=1e6)
        metrics.append(trainer.rl_step(poisoned, RECOMPUTE, breakers=breakers))
        trainer.save(out_dir / "ckpt")
    metrics.append(trainer.restore_step(out_dir / "v1"))
    metrics.append(trainer.rl_step(versioned(probe_batch(trainer, 4), 2), RECOMPUTE, breakers=breakers))
    trainer.export(out_dir / ("policy_resumed" if resume else "policy"))
    if trainer.info.is_main:
        name = "contract_resumed.json" if resume else "contract.json"
        (out_dir / name).write_text(json.dumps({"world_size": trainer.info.world_size, "steps": metrics}))
    from trainer.fsdp import shutdown

    shutdown(trainer.info)
    return metrics


if __name__ == "__main__":
    flags = sys.argv[3:]
    if "--contract" in flags:
        contract_probe(Path(sys.argv[1]), Path(sys.argv[2]), "--resume" in flags)
    elif "--resume" in flags:
        resume_probe(Path(sys.argv[1]), Path(sys.argv[2]), "--lora" in flags)
    else:
        run_probe(Path(sys.argv[1]), Path(sys.argv[2]), "--ac" in flags, "--lora" in flags)
