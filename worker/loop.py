"""The worker's task loop: lease, make sure the weights are there, generate, prove, submit.

One :class:`TaskRunner` per engine (one engine per GPU) shares one ledger client, one weights
cache and one :class:`WorkerState`. Its lease requests are long-polls (``long_poll_s``): with
nothing to lease the ledger holds the request until a task can be leased (a new policy, a
re-opened task), so the runner starts the moment it can rather than at its next retry. For each
leased task the runner downloads the task's policy version if needed (prefetching the next one
while it generates), reloads the engine's weights in place when the version changes, generates
every sample with the ledger's sampling seed, builds a TOPLOC proof from each sample's hidden
states, and submits the group. While it generates, the lease is renewed at a third of its
remaining time. Failures of the ledger or the relays are retried with capped exponential
backoff; a refusal (4xx) of a task's submission is logged and the task is dropped (its lease
will expire and be re-issued); a 403 (banned, or not allowed) ends the worker with that
ForbiddenError. A policy version no relay holds yet (or none served intact) is waited for with
the reason on the status display (:func:`fetch_policy`); a version refused for good, or one that
does not arrive within ``VERSION_WAIT_S``, has its task handed back, and the node leases on.
The version an engine serves and the version of the task being generated are pinned in the
weights cache, so newer versions fetched meanwhile never prune them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from engines.base import Engine
from environments.base import Environment
from environments.episode import EnvironmentReplyError, EpisodeError
from environments.pinning import ImageMismatch, prompt_images
from node.retry import sleep_unless_stopped, sleep_until_work, unless_stopped, with_retries
from protocol.errors import (
    ForbiddenError,
    IntegrityError,
    NotFoundError,
    PrimeError,
    ProtocolError,
    RequestRefused,
    VersionRefusedError,
)
from protocol.ledger_client import LedgerClient
from protocol.schemas import (
    LONG_POLL_S,
    MAX_TOKENS_PER_S,
    HeartbeatRequest,
    LeaseRequest,
    Task,
)
from shardcast.client.cache import WeightsCache
from worker.episodes import EpisodePlayer
from worker.submission import Sample, build_turns_submission, generation_requests

log = logging.getLogger(__name__)
T = TypeVar("T")
MIN_LEASE_INTERVAL_S = 0.2
"""Lease requests that come back empty are at least this far apart, whatever retry delay the ledger names."""
VERSION_WAIT_S = 120.0
"""How long a leased task waits for its policy version to reach a relay (or verify) before it is handed back."""
HANDED_BACK_PAUSE_S = 5.0
"""Pause after handing a task back, so a version this node cannot get does not become a tight lease loop."""
STOP_LEASE_GRACE_S = 1.0
"""Stopped while asking for a lease: how long the answer may still take. A lease the ledger granted as the node
stopped is handed back at once rather than held until it expires."""
STOP_JOBS_GRACE_S = STOP_LEASE_GRACE_S + 0.5
"""Stopped: how long the node's jobs may take to end by themselves (a runner hands back what it was granted)
before they are cancelled (a runner cancelled while generating abandons its lease too)."""
_VERSION_RETRY_MAX_S = 10.0


class TaskHandedBackError(Exception):
    """A leased task cannot run on this node (its policy version is refused, or did not arrive in time)."""


async def fetch_policy(
    weights: WeightsCache, version: int, stop: asyncio.Event, state: WorkerState, wait_s: float | None
) -> Path:
    """The directory of policy ``version``, waiting (``wait_s`` at most; None: until stopped) while no relay holds
    it yet or none served it intact, with the reason in ``state.last_error`` (the status display) and the log.

    A version refused for good (:class:`~protocol.errors.VersionRefusedError`) raises :class:`TaskHandedBackError`
    at once, as does running out of ``wait_s``; unreachable relays are retried by :func:`with_retries`.
    """
    started = time.monotonic()
    delay = 1.0
    while True:
        try:
            # raced against stop: a download in progress ends when the node stops (verified shards stay on disk)
            path = await unless_stopped(
                stop, with_retries(f"download of policy v{version}", lambda: weights.ensure(version), stop)
            )
            if path is None:
                raise asyncio.CancelledError(f"stopped while downloading policy v{version}")
            return path
        except VersionRefusedError as exc:
            state.last_error = f"policy v{version} refused: {exc.message}; waiting for a newer version"
            raise TaskHandedBackError(state.last_error) from exc
        except (NotFoundError, IntegrityError) as exc:  # a relay behind, or relays that served bad bytes
            waited = time.monotonic() - started
            if wait_s is not None and waited + delay > wait_s:
                state.last_error = f"policy v{version} not had in {waited:.0f} s: {exc.message}"
                raise TaskHandedBackError(state.last_error) from exc
            state.last_error = f"waiting for policy v{version} ({exc.message}); retrying in {delay:.0f} s"
            log.warning("%s", state.last_error)
        await sleep_unless_stopped(stop, delay)
        if stop.is_set():
            raise asyncio.CancelledError(f"stopped while waiting for policy v{version}")
        delay = min(delay * 2, _VERSION_RETRY_MAX_S)


@dataclass
class WorkerState:
    """Live numbers for heartbeats and the status display."""

    policy_version: int | None = None
    num_tasks_done: int = 0
    num_samples: int = 0
    num_tokens: int = 0
    num_refused: int = 0
    generation_s: float = 0.0
    current_task: str | None = None
    last_error: str | None = None
    started_at: float = field(default_factory=time.monotonic)
    work_available: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by a gossip announcement of open tasks: an idle task loop asks for a lease at once."""

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.generation_s if self.generation_s > 0 else 0.0


class TaskRunner:
    """Runs leased tasks on one engine until stopped."""

    def __init__(
        self,
        ledger: LedgerClient,
        engine: Engine,
        weights: WeightsCache,
        state: WorkerState,
        eos_token_ids: tuple[int, ...],
        loaded_version: int | None = None,
        long_poll_s: float = LONG_POLL_S,
        episodes: EpisodePlayer | None = None,
        environment: Environment | None = None,
    ) -> None:
        self.long_poll_s = long_poll_s
        self.episodes = episodes
        """A multi-turn run's environment: each sample is played as an episode with it; None: single turns."""
        self.environment = environment
        """The run's environment when its prompts show images: each prompt's images are rendered here from it and
        checked against the task's hashes; None: the prompts are text."""
        self.ledger = ledger
        self.engine = engine
        self.weights = weights
        self.state = state
        self.eos_token_ids = eos_token_ids
        self.loaded_version = loaded_version
        if loaded_version is not None:
            weights.pin(loaded_version)  # the engine serves it: pinned until it serves another

    async def run(self, stop: asyncio.Event) -> None:
        """Lease and run tasks until stopped, proving and submitting one task while generating the next."""
        submitting: asyncio.Task[None] | None = None
        try:
            while not stop.is_set():
                request = LeaseRequest(max_tasks=1, policy_versions_held=self.weights.held_versions()[-16:])
                self.state.work_available.clear()
                asked = time.monotonic()
                call = functools.partial(self.ledger.lease, request, self.long_poll_s)
                asking = asyncio.ensure_future(with_retries("lease", call, stop))
                leased = await unless_stopped(stop, asyncio.shield(asking))
                if leased is None:  # stopped during a long-poll: abandon what the ledger granted meanwhile
                    for task in await self._late_answer(asking):
                        await self._abandon(task.lease_id)
                    break
                if not leased.tasks:
                    # A long-poll that waited its time out says 0: ask again at once. A ledger that answered at
                    # once (no long-polls there, or this node has its most waiting) is asked again later.
                    pause = max(leased.retry_after_s, MIN_LEASE_INTERVAL_S) - (time.monotonic() - asked)
                    if pause > 0:
                        await sleep_until_work(stop, self.state.work_available, pause)
                    continue
                for task in leased.tasks:
                    if stop.is_set():
                        await self._abandon(task.lease_id)
                        break
                    finish = await self.generate_task(task, stop)
                    if finish is None:  # handed back: this node cannot get its policy version now
                        await sleep_until_work(stop, asyncio.Event(), HANDED_BACK_PAUSE_S)
                        continue
                    if submitting is not None:  # one submission in flight at a time
                        try:
                            await submitting
                        except BaseException:
                            finish.close()  # never submitted: its lease expires and is re-issued
                            raise
                    submitting = asyncio.create_task(finish)
        finally:
            if submitting is not None:
                await submitting

    async def generate_task(self, task: Task, stop: asyncio.Event) -> Coroutine[Any, Any, None] | None:
        """Generate a task's samples; return the coroutine that proves and submits them.

        The lease is renewed from here until the submission is answered; a cancellation while
        generating abandons the lease so the ledger can re-issue it at once. A task whose policy
        version this node cannot get (refused, or on no relay within ``VERSION_WAIT_S``) is handed
        back the same way, and None is returned: the node goes on with the next lease. So is a task whose
        episodes cannot be played here (a prompt that is not its example's, an environment that fails to reply)
        or whose pinned images this node's environment does not render.
        """
        self.state.current_task = task.task_id
        renewer = asyncio.create_task(self._renew_until_cancelled(task))
        self.weights.pin(task.policy_version)  # the leased task needs it until its samples are generated
        try:
            await self._load_version(task.policy_version, stop)
            self.weights.prefetch(task.policy_version + 1)
            started = time.monotonic()
            samples = await asyncio.to_thread(self._generate, task)
            self.state.generation_s += time.monotonic() - started
        except (TaskHandedBackError, EpisodeError, EnvironmentReplyError, ImageMismatch) as exc:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            self.state.last_error = f"handed task {task.task_id} back: {exc}"
            log.warning("%s", self.state.last_error)
            await self._abandon(task.lease_id)
            if self.state.current_task == task.task_id:
                self.state.current_task = None
            return None
        except BaseException:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            await self._abandon(task.lease_id)
            raise
        finally:
            self.weights.unpin(task.policy_version)
        return self._prove_and_submit(task, samples, renewer, stop)

    def _generate(self, task: Task) -> list[Sample]:
        """Each sample of ``task``: its uid and the engine's result of each policy turn."""
        if self.episodes is None:
            images = None
            if self.environment is not None:
                environment = self.environment
                images = [prompt_images(environment, p.example_index, p.image_sha256) for p in task.prompts]
            results = self.engine.generate(generation_requests(task, self.eos_token_ids, images))
            return [(result.uid, [result]) for result in results]
        played = self.episodes.play(self.engine.generate, task, self.eos_token_ids)
        return [(episode.uid, episode.turns) for episode in played]

    async def _prove_and_submit(
        self, task: Task, samples: list[Sample], renewer: asyncio.Task[None], stop: asyncio.Event
    ) -> None:
        try:
            submission = await asyncio.to_thread(build_turns_submission, task, self.engine.name, samples)
            answer = await with_retries("submit", lambda: self.ledger.submit(submission), stop)
        except ForbiddenError:
            raise
        except (RequestRefused, ProtocolError) as exc:
            self.state.num_refused += 1
            self.state.last_error = f"submission of {task.task_id} refused: {exc.message}"
            log.warning("%s", self.state.last_error)
        except ValidationError as exc:  # e.g. a NaN logprob from the engine: the ledger would refuse it too
            self.state.num_refused += 1
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            self.state.last_error = f"task {task.task_id} not submitted: its {where} fails the schema: {first['msg']}"
            log.warning("%s", self.state.last_error)
        else:
            self.state.num_tasks_done += 1
            self.state.num_samples += len(samples)
            self.state.num_tokens += sum(len(turn.completion_ids) for _uid, turns in samples for turn in turns)
            log.info(
                "submitted task %s (policy v%d, %d samples): %s",
                task.task_id,
                task.policy_version,
                len(samples),
                answer.status + (" (duplicate)" if answer.duplicate else ""),
            )
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            if self.state.current_task == task.task_id:
                self.state.current_task = None

    async def _load_version(self, version: int, stop: asyncio.Event) -> None:
        if self.loaded_version == version:
            return
        path = await fetch_policy(self.weights, version, stop, self.state, VERSION_WAIT_S)
        await asyncio.to_thread(self.engine.load_weights, path)
        self.weights.pin(version)
        if self.loaded_version is not None:
            self.weights.unpin(self.loaded_version)
        self.loaded_version = version
        self.state.policy_version = version
        log.info("engine %s now serves policy v%d", self.engine.name, version)

    async def _renew_until_cancelled(self, task: Task) -> None:
        deadline = task.deadline
        while True:
            await asyncio.sleep(max(1.0, (deadline - time.time()) / 3))
            try:
                deadline = (await self.ledger.renew(task.lease_id)).deadline
            except PrimeError as exc:
                log.warning("could not renew lease %s: %s", task.lease_id, exc.message)

    async def _late_answer(self, asking: asyncio.Future[Any]) -> list[Task]:
        """The tasks of a lease call still in flight at the stop, if it answers within ``STOP_LEASE_GRACE_S``."""
        done, _ = await asyncio.wait([asking], timeout=STOP_LEASE_GRACE_S)
        if not done:
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
            return []
        if asking.cancelled() or asking.exception() is not None:
            return []
        return list(asking.result().tasks)

    async def _abandon(self, lease_id: str) -> None:
        try:
            await asyncio.wait_for(self.ledger.abandon(lease_id), timeout=5.0)
            log.info("abandoned lease %s", lease_id)
        except (PrimeError, TimeoutError) as exc:
            log.warning("could not abandon lease %s (it will expire): %s", lease_id, exc)


async def run_jobs_until_stopped(jobs: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait until ``stop`` is set or one of the node's ``jobs`` ends; then end them all (see :func:`end_jobs`).
    A job's exception is raised."""
    stopped = asyncio.create_task(stop.wait())
    try:
        done, _pending = await asyncio.wait([*jobs, stopped], return_when=asyncio.FIRST_COMPLETED)
        for job in done:
            if job in jobs and job.exception() is not None:
                raise job.exception()  # type: ignore[misc]
    finally:
        stopped.cancel()
        stop.set()
        await end_jobs(jobs)


async def end_jobs(jobs: list[asyncio.Task[None]]) -> None:
    """Let a stopped node's jobs end by themselves within STOP_JOBS_GRACE_S, then cancel the rest: cancelled at
    once, a runner whose lease call was answered as it stopped would never hand that lease back."""
    if jobs:
        await asyncio.wait(jobs, timeout=STOP_JOBS_GRACE_S)
    for job in jobs:
        job.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)


async def heartbeat_forever(
    ledger: LedgerClient, weights: WeightsCache, state: WorkerState, engine_name: str, stop: asyncio.Event
) -> None:
    """Tell the ledger what this worker holds and how fast it is, at the interval the ledger asks."""
    interval = 10.0
    while not stop.is_set():
        request = HeartbeatRequest(
            policy_versions_held=weights.held_versions()[-16:],
            engine="vllm" if engine_name == "vllm" else "hf",
            tokens_per_s=min(round(state.tokens_per_s, 3), MAX_TOKENS_PER_S),
        )
        try:
            interval = (await ledger.heartbeat(request)).heartbeat_interval_s
        except ForbiddenError:
            raise
        except PrimeError as exc:
            log.warning("heartbeat failed: %s", exc.message)
        await sleep_unless_stopped(stop, interval)
