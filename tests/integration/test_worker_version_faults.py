"""A worker keeps working through download faults, with real coordinator, relay and `prime-worker join` processes.

- Its only relay is behind a new version (origin fallback off): the worker waits for it, saying so, instead
  of exiting with "no relay holds version 1", and works on it once the relay has it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.network import Network
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow


def submitted(net: Network, version: int) -> bool:
    return any(e["data"].get("policy_version") == version for e in net.events("submit"))


def test_a_worker_waits_for_a_relay_behind_a_new_version(network: Network) -> None:
    net = network
    settings: dict[str, Any] = {
        "poll_interval_s": 600,
        "p2p.enabled": "false",
    }  # it mirrors what it finds at start, then sleeps
    relay_url, relay = net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id, **settings)
    port = int(relay_url.rsplit(":", 1)[1])
    worker = net.start_worker("worker", "hf", [relay_url], "--set", "origin_fallback_enabled=false", "--no-p2p")
    wait_until(lambda: submitted(net, 0), 240, "the worker to submit under policy v0")
    net.publish(1)
    log = net.root / "worker.log"
    wait_until(lambda: "waiting for policy v1" in log.read_text(errors="replace"), 240, "the worker to wait for v1")
    assert worker.poll() is None, net.worker_log("worker")  # it used to exit 4: "no relay holds version 1"
    net.relays.stop(relay)  # restarted, the relay mirrors v1 at once
    net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id, port=port, data_dir=net.root / f"relay-{port}")
    wait_until(lambda: submitted(net, 1), 240, "the worker to submit under policy v1 once its relay has it")
    assert worker.poll() is None, net.worker_log("worker")
