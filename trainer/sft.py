"""Supervised fine-tuning on a task's prompt/completion pairs, loss on the completion tokens only.

Step ``s`` trains on pairs ``s * batch_size ...`` of the task's training stream, so the data
order is a function of the step and a resumed run continues exactly where it stopped.
The run writes ``metrics.jsonl``, trainer checkpoints under ``checkpoints/`` and the final
policy as an HF checkpoint under ``policy/``; with ``[lora]`` on, ``policy/`` is the adapter (PEFT's
layout, loaded on top of the base) and ``merged/`` the base with the adapter folded in.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from environments.base import Environment, Example
from environments.episode import MultiTurnEnvironment, PolicyTurn, episode_samples, replay, turn_prompt_ids
from environments.images import Image
from environments.loader import load_environment
from environments.render import ImageBlocks, prompt_ids
from trainer.config import SftConfig
from trainer.fsdp import shutdown
from trainer.metrics import MetricsLogger
from trainer.train import Trainer
from trainer.transport import TrainSample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("trainer.sft")


def sft_sample(
    tokenizer: PreTrainedTokenizerBase, prompt: list[int], answer: str, images: tuple[Image, ...] = ()
) -> TrainSample:
    """The prompt's ids (showing ``images``), then the answer's ids followed by EOS (the model must learn to stop)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; SFT targets need one")
    completion_ids = [*tokenizer.encode(answer, add_special_tokens=False), int(eos)]
    return TrainSample(prompt_ids=list(prompt), completion_ids=completion_ids, images=images)


def episode_sft_samples(
    environment: MultiTurnEnvironment, tokenizer: PreTrainedTokenizerBase, example: Example
) -> list[TrainSample]:
    """The model episode of ``example`` (its :meth:`~MultiTurnEnvironment.reference_turns`, each followed by EOS,
    the environment's replies replayed here): loss on the policy's turns only, never on the replies."""
    turns = environment.reference_turns(example)
    eos = tokenizer.eos_token_id
    if not turns or eos is None:
        raise ValueError(f"environment {environment.name!r} has no reference episode or the tokenizer no EOS token")
    episode = replay(environment, example, [PolicyTurn(turn, False) for turn in turns])
    completions = [[*tokenizer.encode(turn, add_special_tokens=False), int(eos)] for turn in turns]
    return [
        TrainSample(prompt_ids=s.prompt_ids, completion_ids=s.completion_ids, sampled=s.completion_sampled)
        for s in episode_samples(turn_prompt_ids(environment, episode, tokenizer), completions)
    ]


def reference_samples(
    environment: Environment,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    vision: ImageBlocks | None = None,
) -> list[TrainSample]:
    """SFT samples of ``examples``: each prompt (with its images, written with a vision-language policy's
    ``vision`` blocks) and its reference answer, or its model episode for a multi-turn environment."""
    if isinstance(environment, MultiTurnEnvironment):
        return [sample for ex in examples for sample in episode_sft_samples(environment, tokenizer, ex)]
    return [
        sft_sample(tokenizer, prompt_ids(environment, ex, tokenizer, vision), ex.answer or "", ex.images)
        for ex in examples
    ]


def sft_batch(
    environment: Environment,
    tokenizer: PreTrainedTokenizerBase,
    step: int,
    batch_size: int,
    vision: ImageBlocks | None = None,
) -> list[TrainSample]:
    """Training examples ``step * batch_size ...`` with their reference answers, prompts rendered for the policy."""
    examples = environment.sft_examples(step * batch_size, batch_size)
    return reference_samples(environment, tokenizer, examples, vision)


def eval_samples(
    environment: Environment, tokenizer: PreTrainedTokenizerBase, num_examples: int, vision: ImageBlocks | None = None
) -> list[TrainSample]:
    examples = [ex for ex in environment.eval_examples(num_examples) if ex.answer is not None]
    return reference_samples(environment, tokenizer, examples, vision)


def train_sft(trainer: Trainer, config: SftConfig, metrics: MetricsLogger) -> dict[str, Any]:
    """Run SFT steps from the trainer's current step to ``config.num_steps``; returns the last metrics."""
    environment = load_environment(config.environment)
    checkpoints = config.output_dir / "checkpoints"
    last: dict[str, Any] = {}
    while trainer.step < config.num_steps:
        last = trainer.sft_step(
            sft_batch(environment, trainer.tokenizer, trainer.step, config.batch_size, trainer.vision)
        )
        metrics.log(last)
        interval = config.checkpoint.interval_steps
        if interval and trainer.step % interval == 0 and trainer.step < config.num_steps:
            trainer.save(checkpoints)
    return last


def run_sft(config: SftConfig) -> Path:
    """`prime-trainer sft`: train, save the trainer state, export the policy; returns the policy dir."""
    trainer = Trainer(config.trainer_section(), config.num_steps)
    checkpoints = config.output_dir / "checkpoints"
    if config.resume:
        trainer.resume(checkpoints)
    metrics_path = config.output_dir / "metrics.jsonl"
    with MetricsLogger(metrics_path, trainer.info.is_main, config.wandb_project) as metrics:
        train_sft(trainer, config, metrics)
        if config.eval_examples:
            held_out = trainer.completion_loss(
                eval_samples(
                    load_environment(config.environment), trainer.tokenizer, config.eval_examples, trainer.vision
                )
            )
            metrics.log({"step": trainer.step, "eval_completion_loss": held_out})
    trainer.save(checkpoints)
    policy = trainer.export(config.output_dir / "policy")
    if trainer.lora_enabled:
        merged = trainer.export_merged(config.output_dir / "merged")
        if trainer.info.is_main:
            log.info("LoRA adapter in %s; the base with it merged in %s", policy, merged)
    if trainer.info.is_main:
        log.info("SFT done at step %d; policy exported to %s", trainer.step, policy)
    shutdown(trainer.info)
    return policy
