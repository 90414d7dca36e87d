"""A whole run from a bench: write a coordinator config, run ``prime-coordinator start`` on it to its end.

The learning benches (``env_learning``, ``learning_vs_trl``) train through the real network this way: the
coordinator starts its local network (workers, validator, relay) and trainer as children and exits when
the run's steps are done; its output goes to ``coordinator.log`` beside the config. Both score a policy
with :func:`evaluate`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

from protocol.errors import ConfigError
from runtime.config import dotted_to_nested, parse_assignment
from runtime.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 7200


def evaluate(
    model: Path, environment: dict[str, Any], num_examples: int, num_samples: int, max_tokens: int, seed: int = 0
) -> dict[str, Any]:
    """Sampled (T = 1) figures of ``model`` on the held-out split of ``environment`` (a ``[environment]`` table):
    accuracy, reward, stop fraction, completion length; the HF engine (given the images of an environment that shows
    them to a vision-language model), closed after."""
    from engines.base import GenerationRequest
    from engines.hf import HFEngine
    from engines.vision import VisionInputs
    from environments.loader import load_environment
    from trainer.config import EvalConfig
    from trainer.model import load_tokenizer
    from trainer.rollout import RolloutSampler

    config = EvalConfig(model=str(model), environment=environment, num_examples=num_examples, max_tokens=max_tokens)
    engine = HFEngine(model, max_batch_size=512)
    try:
        tokenizer = load_tokenizer(str(model))
        loaded = load_environment(config.environment)
        vision = VisionInputs.of_checkpoint(model)
        sampler = RolloutSampler(engine, GenerationRequest, loaded, tokenizer, 1.0, max_tokens, vision=vision)
        return sampler.evaluate(num_examples, num_samples, seed=seed).as_dict()
    finally:
        engine.close()


def network_run_config(
    name: str, root: Path, start: Path, environment: dict[str, Any], seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """A learning bench's run through the local network: ``args`` give the steps, batch (prompts per task, groups
    per step, group size), token budget, learning rate and warm-up, trainer ranks and ``engines`` (the local
    network's workers); async level 1, temperature 1, every node on this machine trusted; ``args.set`` (when
    given) overrides any key, as ``--set`` reads them."""
    config: dict[str, Any] = {
        "run_name": name,
        "data_dir": str(root / "run"),
        "environment": environment,
        "api": {"host": "127.0.0.1", "port": free_port(), "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {
            "async_level": 1,
            "prompts_per_task": args.prompts_per_task,
            "group_size": args.group_size,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
        },
        "trust": {"validators_open": True},
        "sources": {"allow": ["127.0.0.0/8", "::1/128"]},
        "policy": {"start_checkpoint": str(start), "shard_size_bytes": 262144},
        "orchestrator": {
            "enabled": True,
            "num_steps": args.steps,
            "groups_per_step": args.groups_per_step,
            "trainer_launch": {"nproc": args.trainer_ranks},
            "progress_interval_s": 30,
            "trainer": {"seed": seed, "optimizer": {"lr": args.lr, "warmup_steps": args.warmup_steps}},
        },
        "local_network": {"enabled": True, "engines": args.engines, "num_validators": 1},
    }
    return dotted_to_nested(dict(getattr(args, "set", None) or []), into=config)


def config_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set`` (:func:`runtime.config.parse_assignment`), a bad one as argparse's error."""
    try:
        return parse_assignment(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_network_run_arguments(
    parser: argparse.ArgumentParser, max_tokens: int, trainer_ranks: int = 1, steps: int = 30, lr: float = 5e-4
) -> None:
    """The flags of a learning bench's runs through the local network, as :func:`network_run_config` reads them;
    ``steps`` and ``lr`` are the bench's own defaults (:func:`run_plan` takes ``steps`` unless quick)."""
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 3; quick 1)")
    parser.add_argument("--steps", type=int, default=None, help=f"RL steps per run (default {steps}; quick 4)")
    parser.set_defaults(full_steps=steps)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--warmup-steps", type=int, default=5, help="linear warm-up of the learning rate")
    parser.add_argument("--prompts-per-task", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=8, help="submissions per step (prompts: x 4)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--trainer-ranks", type=int, default=trainer_ranks, help="torchrun ranks of the FSDP2 trainer")
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    parser.add_argument(
        "--set",
        type=config_setting,
        action="append",
        metavar="KEY=VALUE",
        help="override a run config key, e.g. --set orchestrator.no_signal_filter=false (repeatable)",
    )


def run_plan(args: argparse.Namespace, quick_eval: int, full_eval: int = 256) -> tuple[list[int], int]:
    """The seeds and the number of held-out eval prompts of a learning bench, from its ``--quick``, ``--seeds``,
    ``--steps`` and ``--eval-examples`` (``args.steps`` is set: 4 quick, else the bench's default unless given)."""
    args.steps = args.steps or (4 if args.quick else args.full_steps)
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    return seeds, args.eval_examples or (quick_eval if args.quick else full_eval)


def run_coordinator(root: Path, config: dict[str, Any], what: str) -> None:
    """Run ``config`` (written as ``root/run.toml``) to its end; SystemExit naming the log when it fails."""
    path = root / "run.toml"
    path.write_text(tomli_w.dumps(config))
    with (root / "coordinator.log").open("wb") as out:
        done = subprocess.run(
            [str(BIN / "prime-coordinator"), "start", "-c", str(path)],
            stdout=out,
            stderr=out,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            timeout=RUN_TIMEOUT_S,
        )
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}); see {root / 'coordinator.log'}")
