"""Ctrl-C and SIGTERM stop a worker or validator within seconds, from any point of its life, with one line.

:func:`stopping` wraps a node's main coroutine. The first SIGINT or SIGTERM logs one "stopping" line and
sets the node's ``stop`` event: its loops end, the lease in hand is abandoned, a download in progress is
cancelled (verified shards stay on disk for the next start) and an engine that is still starting is
abandoned (:func:`in_thread_unless_stopped` runs such blocking work in a daemon thread the node can walk
away from: a vLLM engine's start cannot be interrupted and takes minutes on a CPU). The process then ends
with exit code 130 (``EXIT_INTERRUPTED``) as soon as the node's own clean-up is done, without joining
threads still busy with work nobody waits for any more (an engine's start, a generation). Whatever does
not stop by itself (a blocking import, a long call holding the event loop) is cut short: the process ends
STOP_GRACE_S after the signal in any case, and a second Ctrl-C ends it at once.

The signal handlers are plain :func:`signal.signal` handlers, not the event loop's, so a signal is heard
even while the loop's thread is busy with blocking work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any, NoReturn, TypeVar

from runtime.cli import EXIT_INTERRUPTED

log = logging.getLogger("node.stopping")
T = TypeVar("T")
STOP_GRACE_S = 4.0
"""How long after the first signal the process may take to stop by itself before it is ended anyway."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` at once: logs flushed, no thread joined, no exit handler run."""
    with contextlib.suppress(Exception):
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class StopSignals:
    """SIGINT/SIGTERM handlers for one node: the first sets ``stop``, the second ends the process at once."""

    def __init__(self, role: str, stop: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        self.role = role
        self.stop = stop
        self.loop = loop
        self.received: int | None = None
        """The first stop signal received, if any."""
        self._first = threading.Event()
        self._again = threading.Event()
        self.announced = threading.Event()
        """Set once the "stopping" line is logged."""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        # Started now, not in the handler: a handler may interrupt the main thread while it holds the lock that
        # starting a thread takes.
        threading.Thread(target=self._watch, name=f"{self.role}-stop", daemon=True).start()
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes, whatever it was doing: hand-offs only. The lines are
        # logged by the watching thread, which also ends the process if the node has not stopped in time.
        if self.received is not None:
            self._again.set()
            return
        self.received = signum
        with contextlib.suppress(RuntimeError):  # the loop is closed: the node is past stopping already
            self.loop.call_soon_threadsafe(self.stop.set)
        self._first.set()

    def _watch(self) -> None:
        self._first.wait()
        name = signal.Signals(self.received or signal.SIGINT).name
        log.warning("stopping the %s (%s); Ctrl-C again to stop at once", self.role, name)
        self.announced.set()
        if self._again.wait(STOP_GRACE_S):
            log.warning("stopping the %s now (a second signal)", self.role)
        else:
            log.warning("the %s did not stop within %.0f s of %s; stopping now", self.role, STOP_GRACE_S, name)
        exit_now(EXIT_INTERRUPTED)


@contextlib.asynccontextmanager
async def stopping(role: str) -> AsyncIterator[asyncio.Event]:
    """The ``stop`` event of a node's main coroutine, set by the first SIGINT or SIGTERM.

    A node stopped by a signal never returns from this block: once the block is left (normally, or with
    the CancelledError a stopped wait raises) the process ends with EXIT_INTERRUPTED. Without a signal the
    block's outcome passes through unchanged.
    """
    stop = asyncio.Event()
    signals = StopSignals(role, stop, asyncio.get_running_loop())
    signals.install()
    try:
        yield stop
    except BaseException as exc:
        if signals.received is None:
            raise
        if not isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            log.debug("while stopping: %s", exc, exc_info=exc)
    finally:
        if signals.received is None:
            signals.restore()
    if signals.received is not None:
        signals.announced.wait(1.0)  # the "stopping" line comes first, and is never lost to the exit
        log.info("%s stopped", role)
        exit_now(EXIT_INTERRUPTED)


async def in_thread_unless_stopped(stop: asyncio.Event, what: str, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` run in a daemon thread, its result once done; if ``stop`` is set first, the thread is
    abandoned (it runs on, its result unused, until the process ends) and asyncio.CancelledError raised.

    For blocking work that cannot be interrupted and would hold up a node's stop, like an engine's start:
    unlike :func:`asyncio.to_thread`, nothing ever waits for the thread (neither the event loop's shutdown
    nor the interpreter's exit).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]  # None only with an error

    def work() -> None:
        try:
            result = func(*args)
        except BaseException as exc:  # handed to the awaiting coroutine, which re-raises it
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=work, name=what, daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    waits: list[asyncio.Future[Any]] = [done, stopped]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        done.cancel()  # its outcome, when it comes, is nobody's
        raise
    finally:
        stopped.cancel()
    if done.done():
        return done.result()
    done.cancel()
    log.debug("%s abandoned: it cannot be interrupted, and the process ends without waiting for it", what)
    raise asyncio.CancelledError(f"stopped during {what}")
