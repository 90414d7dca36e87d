"""Waiting in a node's loop: a call raced against the stop flag ends as soon as the node stops."""

from __future__ import annotations

import asyncio
import time

import pytest

from node.retry import unless_stopped


def test_unless_stopped_returns_the_result_or_none_when_stopped_first() -> None:
    async def main() -> tuple[object, object, float, bool]:
        stop = asyncio.Event()
        quick = await unless_stopped(stop, asyncio.sleep(0, result="leased"))
        cancelled = False

        async def long_poll() -> str:
            nonlocal cancelled
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled = True
                raise
            return "late"

        asyncio.get_running_loop().call_later(0.1, stop.set)
        started = time.monotonic()
        stopped = await unless_stopped(stop, long_poll())
        return quick, stopped, time.monotonic() - started, cancelled

    quick, stopped, took_s, cancelled = asyncio.run(main())
    assert (quick, stopped, cancelled) == ("leased", None, True)
    assert took_s < 5.0


def test_unless_stopped_passes_the_calls_error_on() -> None:
    async def failing() -> None:
        raise PermissionError("banned")

    with pytest.raises(PermissionError, match="banned"):
        asyncio.run(unless_stopped(asyncio.Event(), failing()))
