"""A worker that cheats by a strategy, for the audit bench: `python -m tests.support.cheating_worker`.

It is `prime-worker join` (HF engine, CPU) except that its engine saves compute on some tasks:
``c`` samples of such a task are not generated but copied from the task's first sample (its tokens,
logprobs and proof), so their draws do not follow their own noise streams, which sampling replay
and TOPLOC catch when a validator recomputes one of them. Strategies (one task is one submission):

- ``honest``: never cheats;
- ``always``: every task, every sample but the first copied;
- ``record``: honest for ``--record-tasks`` tasks, then one copied sample in every task (the cheat
  that the audit of one sample in n catches least often);
- ``rarely``: one copied sample in a task with probability ``--rate`` (seeded);
- ``forge``: honest for ``--record-tasks`` tasks, then one sample of every task claims forged logprobs
  (its tokens are the policy's own draw: only its numbers lie, to move an importance ratio);
- ``stale``: honest for ``--record-tasks`` tasks, then one sample of every task drawn by the start policy
  (another policy than the leased version), claimed as the leased version's;
- ``mixed``: with probability ``--rate`` a task has one sample cheated, copied, forged or drawn by the start
  policy (a third each, seeded): the cheats adaptive audit samples rarely;
- ``garbage``: every sample of every task holds random tokens (its last token, and so how it ended, kept): no policy
  drew them, and only a validator that checks nothing accepts them.

Every cheated task is appended to ``DATA_DIR/cheats.jsonl`` (node id, task id, cheated sample uids and how, and
with ``--log-undrawn`` the cheated samples whose tokens differ from the policy's own draw, which the worker then
also makes to know) before its submission is sent, so a bench can count which trained samples were cheated and
which of them the policy did not draw (a sample drawn by an older policy is often the same tokens).

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

STRATEGIES = ("honest", "always", "record", "rarely", "forge", "stale", "mixed", "garbage")
HOW = ("copy", "forge", "stale")
"""The ways ``mixed`` cheats a sample."""
GARBAGE_TOKENS = 256
"""Garbage tokens are drawn from the first ids of the vocabulary (byte tokens: every tokenizer has them)."""
FORGED_LOGPROB = -1e-3
"""What a forged sample claims for each token: the policy was all but sure of it."""
CHEATS_FILE = "cheats.jsonl"


class CheatingEngine:
    """An engine that copies some samples of some tasks instead of generating them (see the module docstring)."""

    def __init__(
        self,
        inner: Engine,
        strategy: str,
        log_path: Path,
        node_id: str,
        record_tasks: int,
        rate: float,
        seed: int,
        stale: Engine | None = None,
        log_undrawn: bool = False,
    ) -> None:
        self.inner = inner
        self.stale = stale
        """An engine that keeps the start policy (``stale`` and ``mixed``)."""
        self.log_undrawn = log_undrawn
        """Also draw the cheated samples honestly, to log which differ from the policy's own draw (costs compute)."""
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

    def _cheats(self, num_samples: int) -> tuple[int, str]:
        """How many samples of the next task to cheat and how (0: honest)."""
        self.tasks_seen += 1
        after_record = self.tasks_seen > self.record_tasks
        if self.strategy == "always":
            return num_samples - 1, "copy"
        if self.strategy == "record":
            return (1 if after_record else 0), "copy"
        if self.strategy == "rarely":
            return (1 if self.rng.random() < self.rate else 0), "copy"
        if self.strategy in ("forge", "stale"):
            return (1 if after_record else 0), self.strategy
        if self.strategy == "mixed" and self.rng.random() < self.rate:
            return 1, self.rng.choice(HOW)
        if self.strategy == "garbage":
            return num_samples, "garbage"
        return 0, "copy"

    def load_weights(self, checkpoint_dir: Path) -> None:
        self.inner.load_weights(checkpoint_dir)  # the stale engine never does: it keeps the start policy

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        by_task: dict[str, list[GenerationRequest]] = {}
        for request in requests:
            by_task.setdefault(request.uid.split("/")[0], []).append(request)
        copied: dict[str, str] = {}  # uid -> the uid whose result it copies
        forged: set[str] = set()
        stale: set[str] = set()
        garbage: set[str] = set()
        cheats: list[dict[str, Any]] = []
        with self._lock:
            for task_id, group in by_task.items():
                count, how = self._cheats(len(group))
                if how == "garbage":
                    victims = [request.uid for request in group]
                    garbage.update(victims)
                else:
                    count = min(count, len(group) - 1)
                    if count <= 0 or (how == "stale" and self.stale is None):
                        continue
                    victims = [request.uid for request in self.rng.sample(group[1:], count)]
                    if how == "copy":
                        copied.update({uid: group[0].uid for uid in victims})
                    else:
                        (forged if how == "forge" else stale).update(victims)
                cheats.append({"node_id": self.node_id, "task_id": task_id, "uids": victims, "how": how})
        honest = [request for request in requests if request.uid not in copied and request.uid not in stale]
        generated = self.inner.generate(honest)
        if stale and self.stale is not None:
            generated += self.stale.generate([request for request in requests if request.uid in stale])
        results = {result.uid: result for result in generated}
        for uid in forged:
            results[uid] = replace(results[uid], logprobs=[FORGED_LOGPROB] * len(results[uid].logprobs))
        for uid in garbage:
            tokens = results[uid].completion_ids
            noise = [self.rng.randrange(GARBAGE_TOKENS) for _ in tokens[:-1]]
            results[uid] = replace(results[uid], completion_ids=[*noise, *tokens[-1:]])
        results.update({uid: replace(results[source], uid=uid) for uid, source in copied.items()})
        self._log(cheats, requests, results)
        return [results[request.uid] for request in requests]

    def _log(
        self, cheats: list[dict[str, Any]], requests: list[GenerationRequest], results: dict[str, GenerationResult]
    ) -> None:
        """Append the cheats to the log, each with the cheated samples whose tokens are not the policy's own draw
        (the honest draw is made here to know; a forged sample's tokens are the draw)."""
        if not cheats:
            return
        if self.log_undrawn:
            suspect = {uid for entry in cheats if entry["how"] != "forge" for uid in entry["uids"]}
            own = {r.uid: r.completion_ids for r in self.inner.generate([q for q in requests if q.uid in suspect])}
            for entry in cheats:
                entry["undrawn"] = [u for u in entry["uids"] if u in own and results[u].completion_ids != own[u]]
        with self.log_path.open("a") as log:
            for entry in cheats:
                log.write(json.dumps(entry) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("coordinator_url")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("strategy", choices=STRATEGIES)
    parser.add_argument("--record-tasks", type=int, default=25)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-undrawn", action="store_true", help="log which cheated samples the policy did not draw")
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
        stale = None
        if args.strategy in ("stale", "mixed"):  # the version it starts with, kept: the policy it cheats with
            stale = create_engine(kind, checkpoint, device, max_batch_size, dtype, cpu_compile, lora_rank)
        log_path = args.data_dir / CHEATS_FILE
        engine: Any = CheatingEngine(
            inner, args.strategy, log_path, node_id, args.record_tasks, args.rate, args.seed, stale, args.log_undrawn
        )
        return engine  # type: ignore[no-any-return]

    config = WorkerConfig(coordinator_url=args.coordinator_url, data_dir=args.data_dir, engine="hf", gpu="none")
    try:
        asyncio.run(run_worker(config, asyncio.Event(), engine_factory=cheating_engine))
    except PrimeError as exc:  # banned, most likely: the end a cheater expects
        raise SystemExit(f"cheating worker ({args.strategy}): {exc.message}") from None


if __name__ == "__main__":
    main()
