"""`prime-trainer rl` and `prime-trainer eval`: the local RL loop and a task's eval set, on the HF engine.

This is where a concrete engine (:mod:`engines.hf`) is wired into the trainer's engine-agnostic
rollout code (:mod:`trainer.rollout`, :mod:`trainer.rl`), one process, no network. A policy given
as a LoRA adapter directory is served on the base it names (:class:`engines.adapted.AdapterView`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.adapted import AdapterView
from engines.adapters import adapter_base, is_adapter_dir
from engines.base import Engine, GenerationRequest
from engines.hf import HFEngine
from engines.vision import VisionInputs
from environments.loader import load_environment
from trainer.config import EvalConfig, RlConfig
from trainer.model import load_tokenizer
from trainer.resolve import resolve_model_path
from trainer.rl import run_rl
from trainer.rollout import RolloutSampler
from trainer.transformers_logs import quiet_transformers
from trainer.transport import write_json_atomic


def hf_engine(model_dir: Path) -> HFEngine:
    """The HF engine on ``model_dir``."""
    quiet_transformers()
    return HFEngine(model_dir, max_batch_size=256)


def policy_engine(model_dir: Path) -> tuple[Engine, Path]:
    """The HF engine serving the policy in ``model_dir`` and the directory of its tokenizer: a checkpoint's own,
    or for a LoRA adapter directory the base it names, with the adapter loaded on it."""
    if not is_adapter_dir(model_dir):
        return hf_engine(model_dir), model_dir
    base = resolve_model_path(adapter_base(model_dir))
    view = AdapterView(hf_engine(base), "policy")
    view.load_weights(model_dir)
    return view, base


def run_local_rl(config: RlConfig) -> dict[str, Any]:
    """`prime-trainer rl`: train with the HF engine in the loop; the eval reward curve, as (step, reward) pairs."""
    engine: Engine = hf_engine(resolve_model_path(config.trainer.model))
    if config.trainer.lora.enabled:  # the engine keeps the base and loads each exported adapter on it
        engine = AdapterView(engine, "policy")
    result = run_rl(config, engine, GenerationRequest)
    return {"eval_reward_curve": [(step, round(report.reward_mean, 4)) for step, report in result.evals]}


def run_eval(config: EvalConfig, output: Path | None = None) -> dict[str, Any]:
    """`prime-trainer eval`: the eval set of ``config``'s task sampled from its model; the report, also written to
    ``output`` (atomically) when given."""
    given = Path(config.model)
    # a ConfigError is one line and exit code 2 (PrimeTyper)
    model_dir = given if is_adapter_dir(given) else resolve_model_path(config.model)
    environment = load_environment(config.environment)
    engine, tokenizer_dir = policy_engine(model_dir)
    tokenizer = load_tokenizer(str(tokenizer_dir))
    vision = VisionInputs.of_checkpoint(tokenizer_dir)
    sampler = RolloutSampler(
        engine, GenerationRequest, environment, tokenizer, config.temperature, config.max_tokens, vision=vision
    )
    report = sampler.evaluate(config.num_examples, config.num_samples, config.seed)
    found = {"model": str(model_dir), **report.as_dict()}
    if output is not None:
        write_json_atomic(output, found)
    return found
