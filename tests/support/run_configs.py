"""The small RL run the network tests start: reverse_text on a tiny policy, one HF worker, one validator, a relay
and a one-rank torchrun trainer, one group a step, written as ``<root>/run.toml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w


def write_small_run(
    root: Path,
    port: int,
    run_name: str,
    start_checkpoint: Path,
    num_steps: int,
    max_tokens: int = 8,
    **orchestrator: Any,
) -> Path:
    """Write the run's config (``orchestrator`` adds or overrides `[orchestrator]` keys) and return its path.
    Every step trains, signal or not (``no_signal_filter`` off): a tiny random policy often scores a whole group
    alike, and these runs show the trainer's figures of every step."""
    config = {
        "run_name": run_name,
        "data_dir": str(root / "run"),
        "environment": {"type": "builtin", "name": "reverse_text"},
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {"async_level": 1, "prompts_per_task": 2, "group_size": 4, "max_tokens": max_tokens},
        "trust": {"validators_open": True},
        "policy": {"start_checkpoint": str(start_checkpoint), "shard_size_bytes": 16384},
        "orchestrator": {
            "enabled": True,
            "num_steps": num_steps,
            "groups_per_step": 1,
            "trainer_launch": {"nproc": 1},
            "no_signal_filter": False,
            **orchestrator,
        },
        "local_network": {"enabled": True, "engines": ["hf"], "num_validators": 1},
    }
    path = root / "run.toml"
    path.write_text(tomli_w.dumps(config))
    return path
