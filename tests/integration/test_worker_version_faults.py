"""A worker keeps working through download faults, with real coordinator, relay and `prime-worker join` processes.

- Its only relay is behind the versions it may still work on (origin fallback off): the worker waits,
  saying so, instead of exiting with "no relay holds version 1", and works on them once the relay has them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.network import Network, running_network, tiny_policy
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow


def submitted(net: Network, version: int) -> bool:
    return any(e["data"].get("policy_version") == version for e in net.events("submit"))


def test_a_worker_waits_for_a_relay_behind_the_versions_it_may_work_on(tmp_path: Path) -> None:
    checkpoints = [tiny_policy(tmp_path / f"policy-{v}", seed=v) for v in range(3)]
    with running_network(tmp_path, checkpoints) as net:
        settings: dict[str, Any] = {"poll_interval_s": 600, "p2p.enabled": "false"}  # mirrors v0 at start, then sleeps
        relay_url, relay = net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id, **settings)
        port = int(relay_url.rsplit(":", 1)[1])
        worker = net.start_worker("worker", "hf", [relay_url], "--set", "origin_fallback_enabled=false", "--no-p2p")
        wait_until(lambda: submitted(net, 0), 240, "the worker to submit under policy v0")
        net.publish(1)
        net.publish(2)  # v0 is now too old to work on (async level 1): the worker needs a version its relay lacks
        log = net.root / "worker.log"
        wait_until(lambda: "waiting for policy v" in log.read_text(errors="replace"), 240, "the worker to wait")
        assert worker.poll() is None, net.worker_log("worker")  # it used to exit 4: "no relay holds version 1"
        net.relays.stop(relay)  # restarted, the relay mirrors the new versions at once
        net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id, port=port, data_dir=net.root / f"relay-{port}")
        wait_until(lambda: submitted(net, 1) or submitted(net, 2), 240, "the worker to submit under a new version")
        assert worker.poll() is None, net.worker_log("worker")
