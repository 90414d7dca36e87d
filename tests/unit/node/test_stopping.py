"""Stopping a node: a signal is heard whatever the node does, blocking work is abandoned, a second signal is final.

The signal tests run a small node in a subprocess (a signal ends the process); the rest run in process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from node.stopping import STOP_GRACE_S, in_thread_unless_stopped, stopping

REPO_ROOT = Path(__file__).resolve().parents[3]
BLOCKED_NODE = """
import asyncio, time
from node.stopping import stopping
from runtime.logs import setup_logging

setup_logging("info", json_logs=False)

async def main() -> None:
    async with stopping("worker"):
        print("ready", flush=True)
        time.sleep(60)  # blocking work in the event loop's own thread: nothing there ever sees the stop event

asyncio.run(main())
"""


def start_blocked_node() -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-c", BLOCKED_NODE]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_node_that_does_not_stop_by_itself_ends_after_the_grace() -> None:
    proc = start_blocked_node()
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    took = time.monotonic() - started
    output = proc.stdout.read() if proc.stdout else ""
    assert code == 130, output
    assert STOP_GRACE_S - 0.5 < took < STOP_GRACE_S + 1.0, (took, output)
    assert "stopping the worker (SIGINT); Ctrl-C again to stop at once" in output
    assert "did not stop within" in output


def test_a_second_signal_ends_the_node_at_once() -> None:
    proc = start_blocked_node()
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    took = time.monotonic() - started
    output = proc.stdout.read() if proc.stdout else ""
    assert code == 130, output
    assert took < STOP_GRACE_S - 1, (took, output)
    assert "stopping the worker (SIGTERM)" in output and "stopping the worker now" in output


def test_without_a_signal_the_block_ends_as_it_would() -> None:
    async def main() -> None:
        async with stopping("validator"):
            raise KeyError("passes through")

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyError, match="passes through"):
        asyncio.run(main())
    assert signal.getsignal(signal.SIGINT) is before


def test_blocking_work_is_abandoned_when_the_node_stops() -> None:
    release = threading.Event()

    def engine_start() -> str:
        release.wait(30)
        return "engine"

    async def main() -> float:
        stop = asyncio.Event()
        assert await in_thread_unless_stopped(stop, "a quick start", lambda: "quick") == "quick"
        with pytest.raises(ValueError, match="bad checkpoint"):
            await in_thread_unless_stopped(stop, "a failing start", _fail)
        asyncio.get_running_loop().call_later(0.2, stop.set)
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError, match="stopped during the engine's start"):
            await in_thread_unless_stopped(stop, "the engine's start", engine_start)
        return time.monotonic() - started

    try:
        assert asyncio.run(main()) < 2
    finally:
        release.set()


def _fail() -> None:
    raise ValueError("bad checkpoint")


@pytest.mark.parametrize(("module", "command"), [("worker.cli", "join"), ("validator.cli", "run")])
def test_help_and_docs_name_the_exit_code_of_a_stop(module: str, command: str) -> None:
    import importlib

    from typer.testing import CliRunner

    from runtime.cli import EXIT_INTERRUPTED

    result = CliRunner().invoke(importlib.import_module(module).app, [command, "--help"])
    assert f"{EXIT_INTERRUPTED} Ctrl-C or SIGTERM: stops within seconds" in result.output
    contributor = (REPO_ROOT / "docs" / "contributor.md").read_text()
    assert f"| {EXIT_INTERRUPTED} | Ctrl-C or SIGTERM, at any point" in contributor
