"""After the last step the coordinator lets its local nodes that heard the run end exit by themselves: stopping
them the moment the ledger saw them told could cut a node off before it has read the answer."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from coordinator.loop.runner import RunThread
from coordinator.processes.local_network import Processes

WIND_DOWN = "import time; time.sleep(1.5); print('the run has ended; stopping', flush=True)"


def test_nodes_that_heard_the_end_exit_by_themselves_before_being_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator")
    network = Processes(tmp_path)
    network.start("relay", [sys.executable, "-c", "import time; time.sleep(60)"])
    network.start("worker-hf", [sys.executable, "-c", WIND_DOWN])
    runner = SimpleNamespace(
        config=SimpleNamespace(orchestrator=SimpleNamespace(end_grace_s=20.0)),
        ledger=SimpleNamespace(live_node_ids=lambda: {"worker"}, told_run_end=frozenset({"worker"})),
        network=network,
        stop_event=threading.Event(),
    )
    try:
        started = time.monotonic()
        RunThread._let_nodes_hear_the_end(runner)  # type: ignore[arg-type]
        waited = time.monotonic() - started
        worker, relay = network.children["worker-hf"], network.children["relay"]
        assert worker.returncode == 0, "the node was not given the time to exit by itself"
        assert relay.running and network.nodes_running() == []
        assert waited < 10
        assert "local worker-hf exited by itself with code 0" in caplog.text  # the operator sees how it ended
    finally:
        network.stop_all()
    assert "stopping" in (tmp_path / "worker-hf.log").read_text()
