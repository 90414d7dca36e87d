"""`prime-worker join`: everything from the node key to a running task loop per engine.

Order of start-up: load or create the node key; find the coordinator's id (the config's, else
the signer of the coordinator's latest manifest, pinned in the data dir on first contact so
a later change is refused); register; download the current policy version through the
relays; start one engine per selected device; then run a heartbeat and a task runner per
engine until ``stop`` is set or the ledger bans the node. In a LoRA run the engines start on the base
(policy v0, checked against the hash the run spec pins, kept for the whole run) and each task runner
loads the adapter of its task's version in place (:class:`engines.adapted.AdapterView`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from engines.adapted import AdapterView
from engines.base import Engine
from engines.hf import DTYPES, HFEngine
from engines.vision import VisionInputs
from engines.vllm import VllmEngine
from environments.episode import MultiTurnEnvironment
from environments.pinning import run_environment
from node.gossip import run_node_gossip
from node.lifecycle import run_node
from node.retry import sleep_unless_stopped, with_retries
from node.startup import check_lora_base, eos_token_ids, software_version, trusted_coordinator_id
from node.stopping import in_thread_unless_stopped
from protocol.errors import ConfigError, IdentityError, StartupError
from protocol.identity import load_or_create_identity, public_key_from_node_id
from protocol.ledger_client import LedgerClient
from protocol.schemas import LORA_BASE_VERSION, Hardware, RegisterRequest, RunSpec
from runtime.data_dir_lock import hold_data_dir
from runtime.first_contact import check_coordinator, check_relays
from shardcast.client.cache import WeightsCache
from worker.config import WorkerConfig
from worker.devices import DeviceInfo, cpu_engine_threads, detect_devices
from worker.episodes import EpisodePlayer
from worker.loop import (
    TaskHandedBackError,
    TaskRunner,
    WorkerState,
    fetch_policy,
    heartbeat_forever,
)
from worker.runs import JoinedRun, check_shared_base, run_data_dir, serve_runs
from worker.status import show_status

log = logging.getLogger(__name__)
PINNED_COORDINATOR_FILE = "coordinator_id"
EngineFactory = Callable[[str, Path, DeviceInfo, int, str, bool, int | None], Engine]
"""(engine kind, checkpoint, device, max batch size, the run's precision, compile vLLM on a CPU, a LoRA run's
adapter rank) -> a started engine."""


def resolve_engine_kind(kind: str) -> str:
    """`auto` means vLLM when it is installed, else HF transformers."""
    if kind != "auto":
        return kind
    import importlib.util

    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


VLLM_MISSING_FIX = (
    "install it (pip install 'prime-network[gpu]' on a CUDA machine, 'prime-network[cpu]' on a CPU) "
    "or run the HF engine with --engine hf"
)


def require_vllm() -> None:
    """A StartupError if vLLM cannot be imported (checked before anything is downloaded)."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise StartupError(f"--engine vllm needs vLLM, which cannot be imported ({exc})", VLLM_MISSING_FIX) from exc


def create_engine(
    kind: str,
    checkpoint_dir: Path,
    device: DeviceInfo,
    max_batch_size: int,
    dtype: str,
    cpu_compile: bool = False,
    lora_rank: int | None = None,
) -> Engine:
    """An engine of ``kind`` computing in ``dtype``, the run's precision (validators recompute in it too); with
    ``lora_rank``, ready to serve LoRA adapters up to that rank on ``checkpoint_dir``, the base."""
    if kind == "vllm":
        if VisionInputs.of_checkpoint(checkpoint_dir) is not None:
            raise ConfigError(
                f"the run's policy ({checkpoint_dir.name}) is a vision-language model, and this worker's vLLM engine "
                "does not run one; join with --engine hf"
            )
        return VllmEngine(
            checkpoint_dir,
            max_batch_size=max_batch_size,
            dtype=dtype,
            device=device.device,
            cpu_compile=cpu_compile,
            lora_rank=lora_rank,
        )
    if dtype not in DTYPES:
        raise ConfigError(f"the run's precision {dtype!r} is not one the HF engine runs in ({', '.join(DTYPES)})")
    threads = cpu_engine_threads() if device.device == "cpu" else None
    return HFEngine(
        checkpoint_dir,
        dtype=dtype,  # type: ignore[arg-type]  # checked above
        device=device.device,
        max_batch_size=max_batch_size,
        num_threads=threads,
    )


async def run_worker(
    config: WorkerConfig,
    stop: asyncio.Event,
    state: WorkerState | None = None,
    engine_factory: EngineFactory = create_engine,
) -> None:
    """Join the run described by ``config`` and work until ``stop`` is set."""
    state = state or WorkerState()
    with hold_data_dir(config.data_dir, "prime-worker"):  # one node per data dir: one id, one weights folder
        await _worker(config, stop, state, engine_factory)


async def _worker(config: WorkerConfig, stop: asyncio.Event, state: WorkerState, engine_factory: EngineFactory) -> None:
    identity = load_or_create_identity(config.data_dir)
    kind = resolve_engine_kind(config.engine)
    devices = detect_devices(config.gpu)
    urls = [config.coordinator_url, *config.also_join]
    log.info("node %s joining %s with %d %s engine(s)", identity.node_id, ", ".join(urls), len(devices), kind)
    for url in urls:
        await check_coordinator(url, config.first_contact_timeout_s, stop)
    await check_relays(config.relays)
    hardware = Hardware(
        accelerator=devices[0].name, num_devices=len(devices), memory_bytes=sum(d.memory_bytes for d in devices)
    )
    registration = RegisterRequest(
        role="worker", hardware=hardware, engine="vllm" if kind == "vllm" else "hf", software_version=software_version()
    )
    runs: list[JoinedRun] = []
    gossip: list[asyncio.Task[None]] = []
    engines: list[Engine] = []
    async with contextlib.AsyncExitStack() as clients:
        try:  # whenever it ends (stopped while downloading or starting an engine too): nothing left running
            for index, url in enumerate(urls):
                ledger = await clients.enter_async_context(LedgerClient(url, identity))
                run_state = state if index == 0 else WorkerState()
                run = await join_run(config, index, url, ledger, registration, run_state, stop)
                runs.append(run)
                if index == 0:  # gossip with the first run's coordinator; the others are heard by long-polls
                    gossip.append(
                        asyncio.create_task(
                            run_node_gossip(
                                config.p2p, url, identity, run.coordinator_id, run.weights, stop, state.work_available
                            )
                        )
                    )
            check_shared_base(runs)
            served = await start_engines(config, runs, kind, devices, engines, engine_factory, stop)
            await serve_runs(served, stop)
        finally:
            stop.set()
            await asyncio.gather(*gossip, return_exceptions=True)
            for run in runs:
                await run.weights.aclose()
            for engine in engines:
                with contextlib.suppress(Exception):
                    engine.close()


async def join_run(
    config: WorkerConfig,
    index: int,
    url: str,
    ledger: LedgerClient,
    registration: RegisterRequest,
    state: WorkerState,
    stop: asyncio.Event,
) -> JoinedRun:
    """Register with run ``index``'s coordinator at ``url``: its pinned id, signed run spec and weights cache."""
    data_dir = run_data_dir(config.data_dir, index, url)
    data_dir.mkdir(parents=True, exist_ok=True)
    configured_id = config.coordinator_id if index == 0 else None
    coordinator_id = await trusted_coordinator_id(ledger, data_dir, configured_id, stop)
    run = await with_retries("run spec", lambda: ledger.run_spec(coordinator_id), stop)
    spec = run.environment
    log.info(
        "run %r environment: %s %r from %s %s (hash %s); precision %s",
        run.run_name,
        spec.kind,
        spec.name,
        spec.package,
        spec.package_version,
        spec.config_hash[:12],
        run.precision,
    )
    if run.lora is not None:
        log.info(
            "LoRA run (rank %d): the base model is policy v0 (hash %s), fetched once; every later version "
            "is an adapter loaded on it in place",
            run.lora.rank,
            run.lora.base_hash[:12],
        )
    if run.images and registration.engine == "vllm":
        raise ConfigError(
            f"the run {run.run_name!r} shows images with its prompts, and this worker's vLLM engine is given text "
            "only; join it with --engine hf"
        )
    if run.images:
        log.info(
            "the run's prompts show images: each is rendered here with the run's environment and checked "
            "against the hash its task pins"
        )
    registered = await with_retries("register", lambda: ledger.register(registration), stop)
    relays = list(config.relays)
    if config.origin_fallback_enabled or not relays:
        relays.append(url.rstrip("/") + "/shardcast")
    weights = WeightsCache(relays, coordinator_id, data_dir / "policies", run_name=run.run_name)
    return JoinedRun(url, data_dir, ledger, coordinator_id, run, registered, weights, state)


async def start_engines(
    config: WorkerConfig,
    runs: list[JoinedRun],
    kind: str,
    devices: list[DeviceInfo],
    engines: list[Engine],
    engine_factory: EngineFactory,
    stop: asyncio.Event,
) -> list[tuple[JoinedRun, list[asyncio.Task[None]]]]:
    """Start one engine per device (appended to ``engines`` as they start) on the first run's start version (a LoRA
    run's: the base, v0, kept for the whole run) and each run's task loops and heartbeat on them."""
    first = runs[0]
    start_version = first.registered.current_policy_version
    lora_rank = max((run.spec.lora.rank for run in runs if run.spec.lora is not None), default=None)
    if lora_rank is not None:  # engines start on the base, v0, and load each version's adapter on it
        start_version = LORA_BASE_VERSION
        for run in runs:
            run.weights.pin(LORA_BASE_VERSION)  # for as long as the node runs
    while True:
        with first.weights.pinned(start_version):  # engines read it while they start, and a cold start is slow
            try:
                checkpoint = await fetch_policy(first.weights, start_version, stop, first.state, wait_s=None)
            except TaskHandedBackError as exc:  # refused for good: wait until a newer one is published
                if lora_rank is not None:
                    raise StartupError(
                        f"this LoRA run's base model (policy v0) cannot be had: {exc}",
                        "ask the run's operator to publish the start checkpoint again",
                    ) from exc
                log.warning("%s", exc)
            else:
                if first.spec.lora is not None:
                    await asyncio.to_thread(check_lora_base, checkpoint, first.spec.lora)
                for device in devices:  # a start that cannot be interrupted is abandoned when stopped
                    what = f"the start of the {kind} engine on {device.device}"
                    args = (
                        kind,
                        checkpoint,
                        device,
                        config.max_batch_size,
                        first.spec.precision,
                        config.vllm_cpu_compile,
                        lora_rank,
                    )
                    engines.append(await in_thread_unless_stopped(stop, what, engine_factory, *args))
                first.state.policy_version = start_version
                log.info("%d %s engine(s) ready on policy v%d", len(engines), kind, start_version)
                # still pinned: the task loops pin it as they start (a version newer ones would prune meanwhile)
                versions = [start_version if run is first else LORA_BASE_VERSION for run in runs]
                return [
                    (run, await run_jobs(config, run, kind, engines, version, stop, check_base=run is not first))
                    for run, version in zip(runs, versions, strict=True)
                ]
        start_version = await newer_policy_version(first.ledger, start_version, stop)


async def run_jobs(
    config: WorkerConfig,
    run: JoinedRun,
    kind: str,
    engines: list[Engine],
    version: int,
    stop: asyncio.Event,
    check_base: bool,
) -> list[asyncio.Task[None]]:
    """A run's heartbeat and one task loop per engine, the engines holding ``version``; with ``check_base`` (a run
    whose base the engines were not started from) its v0 is checked against its own pin first. Its end tokens and
    episodes (or the environment that renders its images) are the run's own."""
    with run.weights.pinned(version):
        checkpoint = await fetch_policy(run.weights, version, stop, run.state, wait_s=None)
        if run.spec.lora is not None and check_base:
            await asyncio.to_thread(check_lora_base, checkpoint, run.spec.lora)
        # transformers' first import is slow too: off the event loop, where a stop is heard
        eos = await in_thread_unless_stopped(stop, "reading the end tokens", eos_token_ids, checkpoint)
        episodes, environment = None, None
        if run.spec.max_turns > 1:
            what = "loading the run's environment"
            episodes = await in_thread_unless_stopped(stop, what, episode_player, run.spec, checkpoint)
        elif run.spec.images:
            what = "loading the run's environment, which renders its images"
            environment = await in_thread_unless_stopped(stop, what, run_environment, run.spec, None)
    run.state.policy_version = version
    runners = [
        TaskRunner(
            run.ledger,
            run_policy(engine, run.spec, run.adapter_name),
            run.weights,
            run.state,
            eos,
            version,
            config.long_poll_s,
            episodes,
            environment,
        )
        for engine in engines
    ]
    jobs = [asyncio.create_task(heartbeat_forever(run.ledger, run.weights, run.state, kind, stop))]
    return jobs + [asyncio.create_task(runner.run(stop)) for runner in runners]


def run_policy(engine: Engine, run: RunSpec, adapter_name: str) -> Engine:
    """What a run's task loop generates with on ``engine``: the engine itself, or for a LoRA run the view of the
    run's adapter (``adapter_name``) on it (the base alone until a version after v0 is loaded)."""
    if run.lora is None:
        return engine
    return AdapterView(engine, adapter_name)


def episode_player(run: RunSpec, checkpoint: Path) -> EpisodePlayer:
    """What a multi-turn run's tasks are played with here: the run's environment, loaded and checked against the
    signed spec (ConfigError, one line, when it cannot be), and the policy's tokenizer."""
    from transformers import AutoTokenizer

    environment = run_environment(run, None)
    if not isinstance(environment, MultiTurnEnvironment):
        raise ConfigError(
            f"the run's episodes have up to {run.max_turns} policy turns, but its environment "
            f"{run.environment.name!r} loads here as a single-turn one; install the version the run names "
            f"({run.environment.package} {run.environment.package_version})"
        )
    log.info("run episodes: up to %d policy turns with %s", run.max_turns, environment.name)
    return EpisodePlayer(environment, AutoTokenizer.from_pretrained(str(checkpoint)))


NEWER_VERSION_POLL_S = 5.0
"""How often a worker whose start version was refused asks the ledger for a newer one."""


async def newer_policy_version(ledger: LedgerClient, refused: int, stop: asyncio.Event) -> int:
    """The ledger's current policy version once it is newer than ``refused`` (the worker has nothing to start on
    until then); asked every NEWER_VERSION_POLL_S, until stopped."""
    while True:
        current = (await with_retries("run status", ledger.status, stop)).current_policy_version
        if current > refused:
            log.info("policy v%d is published; starting on it instead of the refused v%d", current, refused)
            return current
        await sleep_unless_stopped(stop, NEWER_VERSION_POLL_S)
        if stop.is_set():
            raise asyncio.CancelledError(f"stopped while waiting for a policy newer than v{refused}")


def check_config(config: WorkerConfig) -> None:
    """Start-up checks that need no network."""
    if config.engine == "vllm":
        require_vllm()
    if config.coordinator_id is not None:
        try:
            public_key_from_node_id(config.coordinator_id)
        except IdentityError as exc:
            raise ConfigError(f"coordinator_id: {exc.message}") from exc


def run_join(config: WorkerConfig, show_live_status: bool) -> int:
    """`prime-worker join`: the worker until the run ends or a ban; the exit code tells which
    (:func:`node.lifecycle.run_node`)."""
    state = WorkerState()

    async def work(stop: asyncio.Event) -> None:
        check_config(config)
        await run_worker(config, stop, state)

    async def display(stop: asyncio.Event) -> None:
        await show_status(state, stop)

    return run_node("worker", work, display if show_live_status else None)
