"""A whole run from a bench: write a coordinator config, run ``prime-coordinator start`` on it to its end.

The learning benches (``env_learning``, ``learning_vs_trl``) train through the real network this way: the
coordinator starts its local network (workers, validator, relay) and trainer as children and exits when
the run's steps are done; its output goes to ``coordinator.log`` beside the config. Both score a policy
with :func:`evaluate`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 7200


def evaluate(
    model: Path, environment: dict[str, Any], num_examples: int, num_samples: int, max_tokens: int, seed: int = 0
) -> dict[str, Any]:
    """Sampled (T = 1) figures of ``model`` on the held-out split of ``environment`` (a ``[environment]`` table):
    accuracy, reward, stop fraction, completion length; the HF engine, closed after."""
    from engines.base import GenerationRequest
    from engines.hf import HFEngine
    from environments.loader import load_environment
    from trainer.config import EvalConfig
    from trainer.model import load_tokenizer
    from trainer.rollout import RolloutSampler

    config = EvalConfig(model=str(model), environment=environment, num_examples=num_examples, max_tokens=max_tokens)
    engine = HFEngine(model, max_batch_size=512)
    try:
        tokenizer = load_tokenizer(str(model))
        sampler = RolloutSampler(
            engine, GenerationRequest, load_environment(config.environment), tokenizer, 1.0, max_tokens
        )
        return sampler.evaluate(num_examples, num_samples, seed=seed).as_dict()
    finally:
        engine.close()


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
