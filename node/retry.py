"""Waiting and retrying in a node's asyncio loop: sleeps that end when the node stops, capped backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from protocol.errors import RateLimitedError, RemoteUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, returning early when ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def sleep_until_work(stop: asyncio.Event, work_available: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, returning early when ``stop`` or ``work_available`` is set."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(work_available.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def unless_stopped(stop: asyncio.Event, work: Awaitable[T]) -> T | None:
    """The result of ``work``, or None (``work`` cancelled) as soon as ``stop`` is set: a long-poll must not hold
    up a node's shutdown for its whole wait."""
    job = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([job, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not job.done():
            job.cancel()
        await asyncio.gather(job, stopped, return_exceptions=True)
    return job.result() if not job.cancelled() else None


async def with_retries(
    what: str, call: Callable[[], Awaitable[T]], stop: asyncio.Event, max_delay_s: float = 30.0
) -> T:
    """Run ``call``, retrying unavailability and rate limits with capped exponential backoff."""
    delay = 0.5
    while True:
        try:
            return await call()
        except RateLimitedError as exc:
            wait = max(exc.retry_after_s, 0.1)
        except RemoteUnavailableError as exc:
            log.warning("%s failed (%s); retrying in %.1f s", what, exc.message, delay)
            wait, delay = delay, min(delay * 2, max_delay_s)
        if stop.is_set():
            raise asyncio.CancelledError(f"stopped while retrying {what}")
        await sleep_unless_stopped(stop, wait)
