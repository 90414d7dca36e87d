"""`prime-validator run`: pull pending submissions, audit each against its policy version, post verdicts.

The validator registers with its node key (the ledger only accepts operator-approved keys
unless the run is open), learns and pins the coordinator's id like a worker does, downloads
each policy version it needs through SHARDCAST (verified against the signed manifest), keeps
an HF prefill engine per version for the few versions async_level keeps alive, and posts a
verdict per submission. Progress: one log line per verdict and a periodic summary
(verified/s, accepted, rejected and the most common rejection reasons).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from protocol.identity import load_or_create_identity
from protocol.ledger_client import LedgerClient
from protocol.schemas import Hardware, PendingSubmission, RegisterRequest
from shardcast.cache import WeightsCache
from validator.audit import RewardFn, audit_submission, text_reward_fn
from validator.config import ValidatorConfig
from worker.engines.base import PrefillEngine
from worker.loop import sleep_unless_stopped, with_retries
from worker.node import eos_token_ids, software_version, trusted_coordinator_id
from worker.p2p import run_node_gossip

log = logging.getLogger("validator")


@dataclass
class ValidatorState:
    num_accepted: int = 0
    num_rejected: int = 0
    num_rollouts: int = 0
    audit_s: float = 0.0
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)

    def summary(self) -> str:
        rate = self.num_rollouts / self.audit_s if self.audit_s else 0.0
        common = ", ".join(f"{reason} x{count}" for reason, count in self.reasons.most_common(3))
        return f"{self.num_accepted} accepted, {self.num_rejected} rejected, {rate:.1f} rollouts/s verified" + (
            f"; top reasons: {common}" if common else ""
        )


class PolicyEngines:
    """One prefill engine per policy version, the least recently used dropped beyond ``max_loaded``."""

    def __init__(self, weights: WeightsCache, max_loaded: int, max_batch_size: int) -> None:
        self.weights = weights
        self.max_loaded = max_loaded
        self.max_batch_size = max_batch_size
        self._engines: OrderedDict[int, tuple[PrefillEngine, tuple[int, ...], RewardFn]] = OrderedDict()

    async def get(self, version: int) -> tuple[PrefillEngine, tuple[int, ...], RewardFn]:
        if version in self._engines:
            self._engines.move_to_end(version)
            return self._engines[version]
        path: Path = await self.weights.ensure(version)
        from transformers import AutoTokenizer

        from worker.engines.hf import HFEngine

        engine = await asyncio.to_thread(HFEngine, path, max_batch_size=self.max_batch_size)
        eos = eos_token_ids(path)
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(path))
        self._engines[version] = (engine, eos, text_reward_fn(tokenizer, eos))
        while len(self._engines) > self.max_loaded:
            _version, (old, _eos, _reward) = self._engines.popitem(last=False)
            old.close()
        return self._engines[version]

    def close(self) -> None:
        for engine, _eos, _reward in self._engines.values():
            engine.close()
        self._engines.clear()


async def audit_pending(
    ledger: LedgerClient, engines: PolicyEngines, state: ValidatorState, pending: list[PendingSubmission]
) -> None:
    for item in pending:
        engine, eos, reward_fn = await engines.get(item.task.policy_version)
        started = time.monotonic()
        verdict, _rollouts = await asyncio.to_thread(audit_submission, item, engine, eos, None, reward_fn)
        state.audit_s += time.monotonic() - started
        state.num_rollouts += len(item.submission.rollouts)
        answer = await ledger.post_verdict(verdict)
        if verdict.accepted:
            state.num_accepted += 1
        else:
            state.num_rejected += 1
            state.reasons.update(reason.split(":")[0] for reason in verdict.reasons)
        log.info(
            "%s %s from %s%s%s",
            "accepted" if verdict.accepted else "REJECTED",
            item.submission_id,
            item.worker_id[:16],
            "" if verdict.accepted else f": {verdict.reasons[0]}",
            " (worker banned)" if answer.worker_banned else "",
        )


async def run_validator(config: ValidatorConfig, stop: asyncio.Event, state: ValidatorState | None = None) -> None:
    """Audit the run at ``config.coordinator_url`` until ``stop`` is set."""
    state = state or ValidatorState()
    identity = load_or_create_identity(config.data_dir)
    async with LedgerClient(config.coordinator_url, identity) as ledger:
        coordinator_id = await trusted_coordinator_id(ledger, config.data_dir, config.coordinator_id, stop)
        hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=0)
        request = RegisterRequest(role="validator", hardware=hardware, engine="hf", software_version=software_version())
        await with_retries("register", lambda: ledger.register(request), stop)
        log.info("validator %s auditing %s", identity.node_id, config.coordinator_url)
        relays = [*config.relays, config.coordinator_url.rstrip("/") + "/shardcast"]
        weights = WeightsCache(relays, coordinator_id, config.data_dir / "policies", keep_versions=config.max_versions)
        p2p = asyncio.create_task(
            run_node_gossip(config.p2p, config.coordinator_url, identity, coordinator_id, weights, stop)
        )
        engines = PolicyEngines(weights, config.max_versions, config.max_batch_size)
        last_summary = time.monotonic()
        try:
            while not stop.is_set():
                pending = (await with_retries("pending", lambda: ledger.pending(limit=16), stop)).submissions
                if pending:
                    await audit_pending(ledger, engines, state, pending)
                else:
                    await sleep_unless_stopped(stop, config.poll_interval_s)
                if time.monotonic() - last_summary > 10:
                    log.info("%s", state.summary())
                    last_summary = time.monotonic()
        finally:
            log.info("%s", state.summary())
            p2p.cancel()
            await asyncio.gather(p2p, return_exceptions=True)
            engines.close()
            with contextlib.suppress(Exception):
                await weights.aclose()
