"""Progress deadlines: a download that is alive but too slow is cut off, not waited for.

A socket read timeout only fires after a stretch of silence, so a source that sends one
byte a second never trips it. :func:`with_progress_deadline` watches a byte counter while a
request runs instead: the response must start (its first body byte) within
``response_timeout_s``, and from then on every ``window_s`` must bring at least
``min_rate_bps * window_s`` bytes. A request that falls behind is cancelled and
:class:`TooSlowError` is raised, so the caller can demote the source and ask another.
:func:`prompt_answers` asks many sources the same small question without waiting for the
slowest: once one answered, the others get a short grace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class TooSlowError(TimeoutError):
    """A request was cancelled because its source answered too slowly."""


@dataclass(frozen=True)
class ProgressDeadline:
    """How slow a request may be before it is cancelled."""

    response_timeout_s: float
    """Longest wait for the first byte of the body (covers connecting and a trickled response head)."""
    min_rate_bps: float
    """Slowest acceptable body rate, in bytes per second, averaged over ``window_s``."""
    window_s: float
    """Length of the window the rate is measured over."""


async def with_progress_deadline(
    work: Awaitable[T], received: Callable[[], int], deadline: ProgressDeadline, what: str
) -> T:
    """Await ``work`` while ``received()`` (bytes so far) keeps up with ``deadline``; TooSlowError if not."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    started = loop.time()
    window_start: float | None = None
    window_bytes = 0
    tick_s = max(0.05, min(0.5, deadline.window_s / 4, deadline.response_timeout_s / 4))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=tick_s)
            if done:
                return task.result()
            now, got = loop.time(), received()
            if window_start is None:
                if got == 0:
                    if now - started > deadline.response_timeout_s:
                        raise TooSlowError(f"{what}: no data within {deadline.response_timeout_s:g} s")
                    continue
                window_start, window_bytes = now, got
                continue
            if now - window_start >= deadline.window_s:
                rate = (got - window_bytes) / (now - window_start)
                if rate < deadline.min_rate_bps:
                    raise TooSlowError(
                        f"{what}: {rate:.0f} B/s over {now - window_start:.1f} s, "
                        f"below the {deadline.min_rate_bps:.0f} B/s floor"
                    )
                window_start, window_bytes = now, got
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def prompt_answers(asks: Sequence[Awaitable[T]], timeout_s: float, grace_s: float) -> list[T | None]:
    """Run ``asks`` at once; each answer, or None for one that failed or was still out when the
    first answer plus ``grace_s`` (or ``timeout_s`` in all) had passed."""
    tasks = [asyncio.ensure_future(ask) for ask in asks]
    if not tasks:
        return []
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        _, waiting = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if waiting:
            await asyncio.wait(waiting, timeout=min(grace_s, max(0.0, timeout_s - (loop.time() - started))))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [
        task.result() if task.done() and not task.cancelled() and task.exception() is None else None for task in tasks
    ]
