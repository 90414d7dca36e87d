"""Gossip in a real network: coordinator, relay and `prime-worker join` processes on 127.0.0.1.

The coordinator hands out no tasks, so nothing but gossip can make a worker fetch a new policy
version: leases come back empty and heartbeats fetch nothing. The relay polls its upstream only
every minute and the worker may download from that relay alone, so each version it finishes
was also mirrored because the relay heard the announcement. A worker on the gossip network
starts fetching each version `prime-coordinator publish` makes within a second of its
publication and finishes it, while a worker started with `--no-p2p` (polling only) does not.
A stranger that joins the mesh hears the relay announce its address, and a policy announcement
it signs with its own key is dropped (and logged) by the worker and the coordinator alike.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from protocol.announcements import TOPICS, encode_announcement, sign_announcement
from protocol.identity import NodeIdentity
from protocol.schemas import P2PInfo, PolicyAnnouncement, RelayAnnouncement
from runtime.children import stop_processes
from runtime.p2p.host import P2PNode, TopicSpec
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import tiny_policy
from tests.support.shardcast_nodes import Nodes, wait_until
from tests.support.tiny_model import TinyModelSpec

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEC = TinyModelSpec(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
NUM_VERSIONS = 4
MAX_FETCH_START_S = 1.0


@dataclass
class GossipNet:
    url: str
    root: Path
    config_path: Path
    checkpoints: list[Path]
    relays: Nodes
    procs: list[subprocess.Popen[bytes]]

    def start_worker(self, name: str, relay: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = [str(BIN / "prime-worker"), "join", "--coordinator", self.url, "--engine", "hf", "--gpu", "none"]
        argv += ["--data-dir", str(self.root / name), "--json-logs", "--relay", relay, *extra]
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        self.procs.append(proc)
        return proc

    def publish(self, version: int) -> None:
        argv = [str(BIN / "prime-coordinator"), "publish", str(self.checkpoints[version]), "-c", str(self.config_path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    def published_at(self, version: int) -> float:
        page = httpx.get(f"{self.url}/v1/events", params={"after": 0, "limit": 1000}, timeout=5).json()
        return next(float(e["at"]) for e in page["events"] if e["kind"] == "publish" and e["subject"] == str(version))

    def log_entries(self, name: str) -> list[dict[str, Any]]:
        entries = []
        for line in (self.root / f"{name}.log").read_text(errors="replace").splitlines():
            if line.startswith("{"):
                entries.append(json.loads(line))
        return entries

    def first_event(self, name: str, text: str) -> dict[str, Any] | None:
        return next((entry for entry in self.log_entries(name) if text in entry["event"]), None)

    def has_event(self, name: str, text: str) -> bool:
        return self.first_event(name, text) is not None

    def log_tail(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]


@pytest.fixture
def net(tmp_path: Path) -> Iterator[GossipNet]:
    checkpoints = [tiny_policy(tmp_path / f"policy-{v}", seed=v, spec=SPEC) for v in range(NUM_VERSIONS)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "gossip",
        "data_dir": str(tmp_path / "run"),
        "api": {"host": "127.0.0.1", "port": port},
        "policy": {"start_checkpoint": str(checkpoints[0]), "shard_size_bytes": 16384},
    }
    config_path = tmp_path / "run.toml"
    config_path.write_text(tomli_w.dumps(config))
    coordinator = CoordinatorProcess(config_path, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    relays = Nodes(tmp_path)
    gossip_net = GossipNet(url, tmp_path, config_path, checkpoints, relays, [])
    try:
        coordinator.start(url, timeout_s=120)
        yield gossip_net
    finally:
        stop_processes(gossip_net.procs)
        relays.stop_all()
        coordinator.stop()


class Stranger:
    """A peer with its own key that joins the mesh, records what it hears, and publishes forgeries."""

    def __init__(self) -> None:
        self.identity = NodeIdentity.generate()
        self.node = P2PNode(self.identity)
        self.heard: list[tuple[str, bytes]] = []

    def start(self, *addrs: str) -> None:
        record = lambda topic, data: self.heard.append((topic, data))  # noqa: E731
        self.node.start([TopicSpec(topic, lambda *_: True, record) for topic in TOPICS.values()])
        for addr in addrs:
            self.node.connect(addr)

    def relay_announcements(self) -> list[RelayAnnouncement]:
        found = []
        for topic, data in list(self.heard):
            if topic == TOPICS["relay"]:
                found.append(RelayAnnouncement.model_validate(json.loads(data)["body"]))
        return found

    def forge_policy_announcement(self, version: int) -> None:
        forged = PolicyAnnouncement(
            version=version, manifest_sha256="00" * 32, total_size_bytes=1, origin_url=None, published_at=time.time()
        )
        self.node.publish(TOPICS["policy_version"], encode_announcement(sign_announcement(self.identity, forged)))


def test_announced_versions_are_fetched_within_a_second_and_forgeries_ignored(net: GossipNet) -> None:
    coordinator_id = httpx.get(f"{net.url}/v1/policy-versions/latest", timeout=5).json()["signer"]
    info = P2PInfo.model_validate(httpx.get(f"{net.url}/v1/p2p", timeout=5).json())
    assert info.peer_id == coordinator_id and info.addrs
    relay_url, _ = net.relays.relay([f"{net.url}/shardcast"], coordinator_id, poll_interval_s=60)
    gossiping = net.start_worker("worker", relay_url, "--set", "origin_fallback_enabled=false")
    polling = net.start_worker("worker-polling", relay_url, "--no-p2p")

    def ready(name: str) -> bool:
        return (net.root / name / "policies" / "v0").is_dir() and net.first_event(name, "engine(s) ready") is not None

    wait_until(lambda: net.first_event("worker", "p2p: connected to the coordinator") is not None, 120, "p2p join")
    wait_until(lambda: ready("worker") and ready("worker-polling"), 180, "both workers to hold policy v0")
    listening = net.first_event("worker", "listening on")
    assert listening is not None
    stranger = Stranger()
    stranger.start(info.addrs[0], listening["event"].rsplit(" ", 1)[1])
    try:
        time.sleep(1.5)  # let the gossip mesh settle
        latencies = []
        for version in range(1, NUM_VERSIONS):
            net.publish(version)
            marker = f"policy v{version} announced by gossip"
            wait_until(
                functools.partial(net.has_event, "worker", marker), 30, f"the worker to start fetching v{version}"
            )
            started = net.first_event("worker", marker)
            assert started is not None
            latencies.append(float(started["ts"]) - net.published_at(version))
            fetched = net.root / "worker" / "policies" / f"v{version}"
            wait_until(fetched.is_dir, 30, f"the worker to finish fetching v{version} from the relay (woken by gossip)")
        print(f"publication-to-fetch-start latencies (s): {[round(x, 3) for x in latencies]}")
        assert all(latency < MAX_FETCH_START_S for latency in latencies), latencies
        # The version directory appears (atomically) just before the worker logs the finished fetch.
        last = f"fetched announced policy v{NUM_VERSIONS - 1}"
        wait_until(functools.partial(net.has_event, "worker", last), 10, "the worker to log the finished fetch")
        # Polling alone (no tasks to lease) never fetched them: gossip is what did.
        assert not (net.root / "worker-polling" / "policies" / "v1").exists()
        assert net.first_event("worker-polling", "p2p is disabled") is not None
        newest = RelayAnnouncement(url=relay_url, latest_version=NUM_VERSIONS - 1)
        wait_until(lambda: newest in stranger.relay_announcements(), 10, "the relay to announce itself")

        stranger.forge_policy_announcement(99)
        time.sleep(2.0)
    finally:
        stranger.node.stop()
    dropped = net.first_event("worker", f"dropped gossip from {stranger.identity.node_id}")
    assert dropped is not None and "(forbidden)" in dropped["event"], net.log_tail("worker")
    assert net.first_event("worker", "policy v99") is None
    assert not list((net.root / "worker" / "policies").glob("*99"))
    assert f"dropped gossip from {stranger.identity.node_id}" in (net.root / "coordinator.log").read_text()
    assert gossiping.poll() is None, net.log_tail("worker")
    assert polling.poll() is None, net.log_tail("worker-polling")
