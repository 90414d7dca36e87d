"""The runs one worker works for: its coordinator's, and with ``also_join`` more LoRA runs on the same base.

Each run is a coordinator of its own: the worker learns and pins that coordinator's id, fetches its signed run
spec, registers with it, and keeps that run's policy versions in a folder of its own (the first run's are in
the data dir itself, as they always were; another run's under ``runs/<host>_<port>/``). The ledgers never meet:
each run's task loops lease from, submit to and heartbeat their own coordinator.

Several runs share the worker's engines only when they are LoRA runs on one base (the same pinned base hash)
in one precision: the engines start once, on that base, and each run's task loop generates through its own
adapter view (:class:`engines.adapted.AdapterView`), so the base is in memory once however many runs are
served. Work is shared between runs by their task loops taking turns on each engine (its lock): a run with
nothing to lease leaves the engine to the others. A run that ends lets the worker go on with the rest.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from protocol.errors import ConfigError, RunEndedError
from protocol.ledger_client import LedgerClient
from protocol.schemas import RegisterResponse, RunSpec
from shardcast.client.cache import WeightsCache
from worker.loop import WorkerState, run_jobs_until_stopped

log = logging.getLogger(__name__)


@dataclass
class JoinedRun:
    """One run this worker is registered with."""

    url: str
    data_dir: Path
    """Where the run's pinned coordinator id and policy versions are kept."""
    ledger: LedgerClient
    coordinator_id: str
    spec: RunSpec
    registered: RegisterResponse
    weights: WeightsCache
    state: WorkerState

    @property
    def adapter_name(self) -> str:
        """The name of this run's adapter on a shared base engine (unique among the worker's runs)."""
        return f"{self.spec.run_name}@{urlparse(self.url).netloc or self.url}"


def run_data_dir(data_dir: Path, index: int, url: str) -> Path:
    """Where run ``index`` (0: the coordinator_url's, the data dir itself) keeps its pinned id and versions."""
    if index == 0:
        return data_dir
    where = re.sub(r"[^A-Za-z0-9_.-]+", "_", urlparse(url).netloc or url).strip("_") or f"run{index}"
    return data_dir / "runs" / where


def check_shared_base(runs: list[JoinedRun]) -> None:
    """A ConfigError (one line) unless the runs can share one set of engines: a single run, or LoRA runs with one
    base hash and one precision."""
    if len(runs) < 2:
        return
    first = runs[0].spec
    for run in runs:
        spec = run.spec
        if spec.lora is None:
            raise ConfigError(
                f"the run at {run.url} ({spec.run_name!r}) is not a LoRA run; a worker serves several runs only when "
                "they are LoRA runs on one base: join it with a worker (data dir) of its own"
            )
        if first.lora is not None and spec.lora.base_hash != first.lora.base_hash:
            raise ConfigError(
                f"the run at {run.url} trains on another base ({spec.lora.base_hash[:12]}) than the run at "
                f"{runs[0].url} ({first.lora.base_hash[:12]}); join it with a worker (data dir) of its own"
            )
        if spec.precision != first.precision:
            raise ConfigError(
                f"the run at {run.url} computes in {spec.precision}, the run at {runs[0].url} in {first.precision}; "
                "runs that share engines share a precision: join it with a worker (data dir) of its own"
            )


async def serve_run(run: JoinedRun, jobs: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Run one run's jobs (heartbeat, task loops) until the node stops or the run ends; the run's end is logged
    and raised (the caller decides whether the node goes on with other runs)."""
    run_stop = asyncio.Event()
    follow = asyncio.create_task(stop.wait())
    follow.add_done_callback(lambda _: run_stop.set())
    try:
        await run_jobs_until_stopped(jobs, run_stop)
    finally:
        follow.cancel()


async def serve_runs(served: list[tuple[JoinedRun, list[asyncio.Task[None]]]], stop: asyncio.Event) -> None:
    """Serve every run until the node stops or every run has ended (then the last end is raised, as a single run's
    always was); any other failure of a run stops the node."""
    if len(served) == 1:
        run, jobs = served[0]
        await serve_run(run, jobs, stop)
        return
    pending = {asyncio.create_task(serve_run(run, jobs, stop)): run for run, jobs in served}
    ended: RunEndedError | None = None
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                run = pending.pop(task)
                error = task.exception()
                if isinstance(error, RunEndedError):
                    ended = error
                    if pending:
                        log.info("%s; still working for %d other run(s)", error.message, len(pending))
                elif error is not None:
                    raise error
        if ended is not None:
            raise ended
    finally:
        stop.set()
        await asyncio.gather(*pending, return_exceptions=True)
