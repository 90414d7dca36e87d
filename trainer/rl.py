"""A local RL run: the trainer and one engine in a synchronous loop (generate, score, step, reload).

This is what `prime-trainer rl` and bench/rl_learning.py run, one process, no network. Each
step samples ``prompts_per_step x group_size`` completions with the engine at the current
policy, scores them with the task, turns rewards into group-relative advantages, takes one
:meth:`Trainer.rl_step`, exports the policy and reloads it into the engine. The sampled reward
on the task's fixed eval set (same noise seed every time, so evaluations differ only by the
policy) is measured before training, every ``eval_interval_steps`` and at the end.

The network's orchestrator drives the same :meth:`Trainer.rl_step` with rollouts from many
workers, asynchronously; that loop is the coordinator's (``coordinator/loop/orchestrator.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from environments.episode import MultiTurnEnvironment
from environments.loader import load_environment
from protocol.errors import ConfigError
from trainer.config import RlConfig
from trainer.metrics import MetricsLogger
from trainer.rollout import EvalReport, RequestFactory, RolloutEngine, RolloutSampler, step_seed, to_train_samples
from trainer.train import Trainer

log = logging.getLogger("trainer.rl")

EVAL_SEED_OFFSET = 7_777_777


@dataclass
class RlResult:
    evals: list[tuple[int, EvalReport]] = field(default_factory=list)
    """(step, report) pairs, first before any training."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The per-step metrics records."""


def run_rl(
    config: RlConfig,
    engine: RolloutEngine,
    make_request: RequestFactory,
    trainer: Trainer | None = None,
) -> RlResult:
    """Train ``config.num_steps`` RL steps; ``engine`` must start from the same weights as the trainer."""
    environment = load_environment(config.environment)
    if isinstance(environment, MultiTurnEnvironment):
        raise ConfigError(
            f"environment {environment.name!r} is multi-turn: the local RL loop trains single-turn environments; "
            "train it through the network (prime-coordinator start with [orchestrator] enabled)"
        )
    trainer = trainer or Trainer(config.trainer, config.num_steps)
    if trainer.info.world_size != 1:
        raise ValueError("the local RL loop runs in one process; the network drives Trainer.rl_step on every rank")
    tokenizer, vision = trainer.tokenizer, trainer.vision
    sampler = RolloutSampler(
        engine, make_request, environment, tokenizer, config.temperature, config.max_tokens, vision=vision
    )
    policy_dir = config.output_dir / "policy"
    result = RlResult()

    def run_eval() -> None:
        if not config.eval_examples:
            return
        report = sampler.evaluate(config.eval_examples, seed=EVAL_SEED_OFFSET + config.trainer.seed)
        result.evals.append((trainer.step, report))
        metrics.log({"step": trainer.step, **{f"eval_{k}": v for k, v in report.as_dict().items()}})

    if config.resume and trainer.resume(config.output_dir / "checkpoints"):
        engine.load_weights(trainer.export(policy_dir))
    with MetricsLogger(config.output_dir / "metrics.jsonl", wandb_project=config.wandb_project) as metrics:
        run_eval()
        while trainer.step < config.num_steps:
            start = trainer.step * config.prompts_per_step
            examples = [environment.example(start + i) for i in range(config.prompts_per_step)]
            rollouts = sampler.sample(examples, config.group_size, step_seed(config.trainer.seed, trainer.step))
            samples = to_train_samples(rollouts, config.group_size, config.normalize_std)
            record = trainer.rl_step(samples, config.loss, config.temperature)
            metrics.log(record)
            result.steps.append(record)
            engine.load_weights(trainer.export(policy_dir))
            interval = config.trainer.checkpoint.interval_steps
            if interval and trainer.step % interval == 0:
                trainer.save(config.output_dir / "checkpoints")
            if config.eval_interval_steps and trainer.step % config.eval_interval_steps == 0:
                run_eval()
        if not result.evals or result.evals[-1][0] != trainer.step:
            run_eval()
    trainer.save(config.output_dir / "checkpoints")
    return result
