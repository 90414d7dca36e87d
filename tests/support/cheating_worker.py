"""A worker that cheats by a strategy, for the audit bench: `python -m tests.support.cheating_worker`.

It is `prime-worker join` (HF engine, CPU) except that its engine saves compute on some tasks:
``c`` samples of such a task are not generated but copied from the task's first sample (its tokens,
logprobs and proof), so their draws do not follow their own noise streams, which sampling replay
and TOPLOC catch when a validator recomputes one of them. Strategies (one task is one submission):

- ``honest``: never cheats;
- ``always``: every task, every sample but the first copied;
- ``record``: honest for ``--record-tasks`` tasks, then one copied sample in every task (the cheat
  that the audit of one sample in n catches least often);
- ``rarely``: one copied sample in a task with probability ``--rate`` (seeded).

Every cheated task is appended to ``DATA_DIR/cheats.jsonl`` (node id, task id, copied sample uids)
before its submission is sent, so a bench can count which trained samples were cheated.

Usage: ``python -m tests.support.cheating_worker COORDINATOR_URL DATA_DIR STRATEGY [--record-tasks N]
[--rate R] [--seed S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.base import Engine, GenerationRequest, GenerationResult
from protocol.errors import PrimeError
from protocol.identity import load_or_create_identity
from runtime.logs import setup_logging
from worker.config import WorkerConfig
from worker.devices import DeviceInfo
from worker.join import create_engine, run_worker

STRATEGIES = ("honest", "always", "record", "rarely")
CHEATS_FILE = "cheats.jsonl"


class CheatingEngine:
    """An engine that copies some samples of some tasks instead of generating them (see the module docstring)."""

    def __init__(
        self, inner: Engine, strategy: str, log_path: Path, node_id: str, record_tasks: int, rate: float, seed: int
    ) -> None:
        self.inner = inner
        self.strategy = strategy
        self.log_path = log_path
        self.node_id = node_id
        self.record_tasks = record_tasks
        self.rate = rate
        self.rng = random.Random(seed)
        self.tasks_seen = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _copies(self, num_samples: int) -> int:
        """How many samples of the next task to copy (0: honest)."""
        self.tasks_seen += 1
        if self.strategy == "always":
            return num_samples - 1
        if self.strategy == "record":
            return 1 if self.tasks_seen > self.record_tasks else 0
        if self.strategy == "rarely":
            return 1 if self.rng.random() < self.rate else 0
        return 0

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        by_task: dict[str, list[GenerationRequest]] = {}
        for request in requests:
            by_task.setdefault(request.uid.split("/")[0], []).append(request)
        copied: dict[str, str] = {}  # uid -> the uid whose result it copies
        with self._lock:
            for task_id, group in by_task.items():
                count = min(self._copies(len(group)), len(group) - 1)
                if count <= 0:
                    continue
                source = group[0].uid
                victims = [request.uid for request in self.rng.sample(group[1:], count)]
                copied.update({uid: source for uid in victims})
                with self.log_path.open("a") as log:
                    log.write(json.dumps({"node_id": self.node_id, "task_id": task_id, "uids": victims}) + "\n")
        generated = self.inner.generate([request for request in requests if request.uid not in copied])
        results = {result.uid: result for result in generated}
        return [
            replace(results[copied[request.uid]], uid=request.uid) if request.uid in copied else results[request.uid]
            for request in requests
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("coordinator_url")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("strategy", choices=STRATEGIES)
    parser.add_argument("--record-tasks", type=int, default=25)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    setup_logging("info", json_logs=True)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    node_id = load_or_create_identity(args.data_dir).node_id

    def cheating_engine(
        kind: str,
        checkpoint: Path,
        device: DeviceInfo,
        max_batch_size: int,
        dtype: str,
        cpu_compile: bool,
        lora_rank: int | None,
    ) -> Engine:
        inner = create_engine(kind, checkpoint, device, max_batch_size, dtype, cpu_compile, lora_rank)
        log_path = args.data_dir / CHEATS_FILE
        engine: Any = CheatingEngine(inner, args.strategy, log_path, node_id, args.record_tasks, args.rate, args.seed)
        return engine  # type: ignore[no-any-return]

    config = WorkerConfig(coordinator_url=args.coordinator_url, data_dir=args.data_dir, engine="hf", gpu="none")
    try:
        asyncio.run(run_worker(config, asyncio.Event(), engine_factory=cheating_engine))
    except PrimeError as exc:  # banned, most likely: the end a cheater expects
        raise SystemExit(f"cheating worker ({args.strategy}): {exc.message}") from None


if __name__ == "__main__":
    main()
