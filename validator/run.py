"""`prime-validator run`: pull pending submissions, audit each against its policy version, post verdicts.

The validator registers with its node key (the ledger only accepts operator-approved keys
unless the run is open), learns and pins the coordinator's id like a worker does, downloads
each policy version it needs through SHARDCAST (verified against the signed manifest), keeps
an HF prefill engine per version for the few versions async_level keeps alive, audits the
pending submissions of each version together (one prefill batch across them, only the samples
the ledger picked) and posts a verdict per submission, with the rewards recomputed by the run's
environment. Its requests for pending submissions are long-polls (``long_poll_s``): with
nothing to audit the ledger holds the request until a submission arrives. Before it registers it
fetches the run spec the coordinator signed and loads that environment
(:func:`environments.pinning.run_environment`); one it cannot load identically stops it with the
reason and what to install. It recomputes in the run spec's precision and audits every
submission with one set of TOPLOC thresholds from that precision's calibrations, whatever engine
the submission names (:class:`validator.audit.Thresholds`); a precision with no calibration for
some generating engine stops it at start-up with the command that makes one. Nothing one
submission brings stops it: an environment that cannot score a group yields an
``environment_error`` verdict, and a policy version it cannot fetch leaves those submissions to the
ledger (which expires submissions of versions the origin no longer keeps) while it audits the rest. Progress
(:mod:`validator.progress`): one log line per verdict and a periodic summary (verified
samples/s and submissions/s, accepted, rejected and the most common rejection reasons).
Each version with a loaded engine, and each version being audited, is pinned in the weights
cache, so pruning never removes it from under an audit. In a LoRA run one engine holds the base
(version 0, checked against the hash the run spec pins) and each version audited is its adapter
on that base, so a worker that generated with the base alone, an older adapter or another run's is
caught by the same TOPLOC checks as any other substitution.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from engines.adapted import AdapterView
from engines.base import PrefillEngine
from engines.hf import HFEngine
from environments.base import Environment
from environments.episode import MultiTurnEnvironment
from environments.pinning import run_environment
from node.gossip import run_node_gossip
from node.lifecycle import run_node
from node.retry import sleep_unless_stopped, unless_stopped, with_retries
from node.startup import check_lora_base, eos_token_ids, software_version, trusted_coordinator_id
from node.stopping import in_thread_unless_stopped
from protocol.errors import ForbiddenError, PrimeError, ProtocolError, RequestRefused
from protocol.identity import load_or_create_identity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LORA_BASE_VERSION, Hardware, LoraPin, PendingSubmission, RegisterRequest
from runtime.data_dir_lock import hold_data_dir
from runtime.first_contact import check_coordinator, check_relays
from shardcast.client.cache import WeightsCache
from toploc.calibrations import require_calibrated
from toploc.config import ToplocConfig
from validator.audit import (
    Episodes,
    RewardFn,
    Thresholds,
    audit_submissions_safely,
    environment_reward_fn,
    mostly_unrecomputed,
)
from validator.config import ValidatorConfig
from validator.progress import ValidatorState, show_status

log = logging.getLogger("validator")


@dataclass(frozen=True)
class LoadedPolicy:
    """A policy version ready to audit against: its prefill engine, end tokens and rewards, for a multi-turn run how
    its episodes are rebuilt, and the run's environment, which renders the images prompts pin."""

    engine: PrefillEngine
    eos_token_ids: tuple[int, ...]
    reward_fn: RewardFn
    episodes: Episodes | None
    environment: Environment | None = None


class PolicyEngines:
    """One prefill engine per policy version (in the run's ``dtype``), the least recently used dropped beyond
    ``max_loaded``. In a LoRA run (``lora``) one HF engine holds the base (version 0, checked against the pinned
    hash and kept for the whole run) and each version is its adapter on it, named ``v<N>``."""

    def __init__(
        self,
        weights: WeightsCache,
        max_loaded: int,
        max_batch_size: int,
        environment: Environment,
        dtype: str = "float32",
        stop: asyncio.Event | None = None,
        lora: LoraPin | None = None,
    ) -> None:
        self.weights = weights
        self.stop = stop or asyncio.Event()
        """The node's stop flag: a download or an engine's start in progress is abandoned when it is set."""
        self.dtype = dtype
        self.environment = environment
        self.max_loaded = max_loaded
        self.max_batch_size = max_batch_size
        self.lora = lora
        self._engines: OrderedDict[int, LoadedPolicy] = OrderedDict()
        self._base: tuple[PrefillEngine, Path] | None = None
        """A LoRA run's base engine and directory, loaded with the first version audited."""

    async def get(self, version: int) -> LoadedPolicy:
        if version in self._engines:
            self._engines.move_to_end(version)
            return self._engines[version]
        self.weights.pin(version)  # pinned while its engine is loaded
        try:
            self._engines[version] = await self._load(version)
        except BaseException:
            self.weights.unpin(version)
            raise
        while len(self._engines) > self.max_loaded:
            old_version, old = self._engines.popitem(last=False)
            old.engine.close()
            self.weights.unpin(old_version)
        return self._engines[version]

    async def _fetch(self, version: int) -> Path:
        path = await unless_stopped(self.stop, self.weights.ensure(version))
        if path is None:
            raise asyncio.CancelledError(f"stopped while downloading policy v{version}")
        return path

    async def _start_engine(self, path: Path, version: int) -> PrefillEngine:
        start = functools.partial(
            HFEngine,
            path,
            max_batch_size=self.max_batch_size,
            dtype=self.dtype,  # type: ignore[arg-type]  # a calibrated precision, checked at start-up
        )
        engine: PrefillEngine = await in_thread_unless_stopped(
            self.stop, f"the start of the engine for policy v{version}", start
        )
        return engine

    async def _lora_base(self, lora: LoraPin) -> tuple[PrefillEngine, Path]:
        """The base engine of a LoRA run, started on version 0 once its files match the pinned hash."""
        if self._base is None:
            self.weights.pin(LORA_BASE_VERSION)  # for the whole run: every version is served on it
            path = await self._fetch(LORA_BASE_VERSION)
            await asyncio.to_thread(check_lora_base, path, lora)
            self._base = (await self._start_engine(path, LORA_BASE_VERSION), path)
        return self._base

    async def _load(self, version: int) -> LoadedPolicy:
        path = policy = await self._fetch(version)
        from transformers import AutoTokenizer

        engine: PrefillEngine
        if self.lora is None:
            engine = await self._start_engine(policy, version)
        else:
            base, path = await self._lora_base(self.lora)  # end tokens and tokenizer: the base's
            view = AdapterView(base, f"v{version}")
            await asyncio.to_thread(view.load_weights, policy)
            engine = view
        eos = eos_token_ids(path)
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(path))
        episodes = Episodes(self.environment, tokenizer) if isinstance(self.environment, MultiTurnEnvironment) else None
        reward_fn = environment_reward_fn(self.environment, tokenizer, eos)
        return LoadedPolicy(engine, eos, reward_fn, episodes, self.environment)

    def close(self) -> None:
        for version, loaded in self._engines.items():
            loaded.engine.close()
            self.weights.unpin(version)
        self._engines.clear()
        if self._base is not None:
            self._base[0].close()
            self.weights.unpin(LORA_BASE_VERSION)
            self._base = None


async def audit_pending(
    ledger: LedgerClient,
    engines: PolicyEngines,
    state: ValidatorState,
    pending: list[PendingSubmission],
    stop: asyncio.Event,
    toploc: Thresholds | ToplocConfig | None = None,
) -> None:
    """Audit pending submissions, one prefill batch per policy version, and post each verdict.

    ``toploc`` holds the proof thresholds: the run's (:class:`Thresholds`), or one :class:`ToplocConfig`;
    None: the float32 run's. A version that cannot be fetched (no relay or origin holds it any more) is
    skipped with a warning: its submissions stay the ledger's to close, the others are audited."""
    by_version: dict[int, list[PendingSubmission]] = {}
    for item in pending:
        by_version.setdefault(item.task.policy_version, []).append(item)
    with engines.weights.pinned(*by_version):  # being verified: kept until every verdict is posted
        for version, items in sorted(by_version.items()):
            try:
                await engines.get(version)
            except ForbiddenError:
                raise
            except PrimeError as exc:  # e.g. no relay holds the version any more: one version, not the validator
                state.num_unfetchable += len(items)
                log.warning(
                    "cannot audit %d submission(s) of policy v%d: %s; skipping them", len(items), version, exc.message
                )
                continue
            await _audit_version(ledger, engines, state, version, items, stop, toploc)


async def _audit_version(
    ledger: LedgerClient,
    engines: PolicyEngines,
    state: ValidatorState,
    version: int,
    items: list[PendingSubmission],
    stop: asyncio.Event,
    toploc: Thresholds | ToplocConfig | None,
) -> None:
    """Audit the pending submissions of one policy version in one prefill batch, with the run's thresholds
    whatever engine each names, and post each verdict."""
    loaded = await engines.get(version)
    state.policy_version = version
    started, cpu_started = time.monotonic(), time.process_time()
    thresholds = toploc if toploc is not None else Thresholds()
    config = thresholds.config() if isinstance(thresholds, Thresholds) else thresholds
    what = f"the audit of {len(items)} submission(s) of policy v{version}"  # their verdicts are left to the ledger
    audited = await in_thread_unless_stopped(
        stop,
        what,
        audit_submissions_safely,
        items,
        loaded.engine,
        loaded.eos_token_ids,
        config,
        loaded.reward_fn,
        loaded.episodes,
        loaded.environment,
    )
    state.audit_s += time.monotonic() - started
    state.audit_cpu_s += time.process_time() - cpu_started
    for item, (verdict, rollouts) in zip(items, audited, strict=True):
        state.record(verdict, len(item.submission.rollouts), len(rollouts))
        try:
            answer = await with_retries("verdict", functools.partial(ledger.post_verdict, verdict), stop)
        except ForbiddenError:  # banned or not approved: stop (with_retries already retried 429s and 5xx)
            raise
        except (RequestRefused, ProtocolError) as exc:  # a refusal (4xx): nothing a retry would change
            log.warning("verdict on %s refused: %s", item.submission_id, exc.message)
            continue
        unscored = verdict.environment_error is not None  # the run's environment failed: an operator's matter
        log.log(
            logging.WARNING if unscored else logging.INFO,
            "%s %s from %s (%s)%s%s",
            "environment error on" if unscored else "accepted" if verdict.accepted else "REJECTED",
            item.submission_id,
            item.worker_id[:16],
            answer.status,
            "" if verdict.accepted else f": {verdict.reasons[0]}",
            " (worker banned)" if answer.worker_banned else "",
        )


async def run_validator(config: ValidatorConfig, stop: asyncio.Event, state: ValidatorState | None = None) -> None:
    """Audit the run at ``config.coordinator_url`` until ``stop`` is set."""
    state = state or ValidatorState()
    with hold_data_dir(config.data_dir, "prime-validator"):  # one node per data dir: one id, one weights folder
        await _validator(config, stop, state)


def run_audit(config: ValidatorConfig, show_live_status: bool = False) -> int:
    """`prime-validator run`: the validator until the run ends; the exit code says how it ended
    (:func:`node.lifecycle.run_node`)."""
    state = ValidatorState()

    async def work(stop: asyncio.Event) -> None:
        await run_validator(config, stop, state)

    async def display(stop: asyncio.Event) -> None:
        await show_status(state, stop)

    return run_node("validator", work, display if show_live_status else None)


async def _validator(config: ValidatorConfig, stop: asyncio.Event, state: ValidatorState) -> None:
    identity = load_or_create_identity(config.data_dir)
    await check_coordinator(config.coordinator_url, config.first_contact_timeout_s, stop)
    await check_relays(config.relays)
    async with LedgerClient(config.coordinator_url, identity) as ledger:
        coordinator_id = await trusted_coordinator_id(ledger, config.data_dir, config.coordinator_id, stop)
        spec = await with_retries("run spec", lambda: ledger.run_spec(coordinator_id), stop)
        require_calibrated(spec.precision)  # a ConfigError naming the precision and the command that calibrates it
        environment = await in_thread_unless_stopped(
            stop, "loading the run's environment", run_environment, spec, config.environment
        )
        log.info(
            "environment %s %r (hash %s) loaded and checked",
            spec.environment.kind,
            spec.environment.name,
            spec.environment.config_hash[:12],
        )
        hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=0)
        request = RegisterRequest(
            role="validator", hardware=hardware, engine=config.engine, software_version=software_version()
        )
        await with_retries("register", lambda: ledger.register(request), stop)
        log.info("validator %s auditing %s", identity.node_id, config.coordinator_url)
        relays = [*config.relays, config.coordinator_url.rstrip("/") + "/shardcast"]
        weights = WeightsCache(
            relays,
            coordinator_id,
            config.data_dir / "policies",
            keep_versions=config.max_versions,
            run_name=spec.run_name,
        )
        p2p = asyncio.create_task(
            run_node_gossip(config.p2p, config.coordinator_url, identity, coordinator_id, weights, stop)
        )
        engines = PolicyEngines(
            weights, config.max_versions, config.max_batch_size, environment, spec.precision, stop, spec.lora
        )
        thresholds = Thresholds(spec.precision, config.toploc)
        log.info("recomputing in %s, with its TOPLOC calibrations", spec.precision)
        last_summary = time.monotonic()
        try:
            while not stop.is_set():
                asked = time.monotonic()
                call = functools.partial(
                    ledger.pending, limit=config.max_submissions_per_batch, wait_s=config.long_poll_s
                )
                answer = await unless_stopped(stop, with_retries("pending", call, stop))
                if answer is None:  # stopped during a long-poll
                    break
                if answer.submissions:
                    skipped = state.num_unfetchable
                    await audit_pending(ledger, engines, state, answer.submissions, stop, thresholds)
                    if state.num_unfetchable > skipped:  # the same ones come back until the ledger closes them
                        await sleep_unless_stopped(stop, config.poll_interval_s)
                    elif len(answer.submissions) < config.max_submissions_per_batch and mostly_unrecomputed(
                        answer.submissions
                    ):  # let the next ones gather into one batch (a full list: more are waiting already)
                        await sleep_unless_stopped(stop, config.gather_s)
                else:  # a long-poll waited already; a ledger that answered at once is asked again later
                    await sleep_unless_stopped(stop, config.poll_interval_s - (time.monotonic() - asked))
                if time.monotonic() - last_summary > config.summary_interval_s:
                    log.info("%s", state.summary(), extra=state.figures())
                    last_summary = time.monotonic()
        finally:
            log.info("%s", state.summary(), extra=state.figures())
            p2p.cancel()
            await asyncio.gather(p2p, return_exceptions=True)
            engines.close()
            with contextlib.suppress(Exception):
                await weights.aclose()
