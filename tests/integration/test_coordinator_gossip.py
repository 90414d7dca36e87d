"""The coordinator's announcer on a real SQLite ledger and real libp2p sockets, heard by a pinned peer.

A publication in the ledger is announced (version, manifest digest, origin URL, publication
time) and announced once; an abandoned lease puts its task back to wait, and that is announced
as task availability; ``GET /v1/p2p`` answers with the coordinator's dialable addresses, or a
clear 404 when p2p is disabled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from coordinator.ledger.ledger import Ledger
from coordinator.ledger.storage.engine import Database
from coordinator.serving.errors import install_error_handlers
from coordinator.serving.p2p import CoordinatorGossip, mount_p2p_info, start_coordinator_gossip
from protocol.announcements import Accepted, manifest_digest
from protocol.identity import NodeIdentity
from protocol.schemas import LeaseRequest, P2PInfo, PolicyAnnouncement, TaskAnnouncement
from runtime.p2p.config import P2PConfig
from runtime.p2p.gossip import Gossip
from tests.support.ledger_helpers import CountingPrompts, ledger_config, register_request, signed_manifest

pytestmark = pytest.mark.slow
ORIGIN = "http://127.0.0.1:8000/shardcast"


class Heard:
    def __init__(self) -> None:
        self.items: list[Accepted] = []
        self.changed = threading.Condition()

    def __call__(self, accepted: Accepted) -> None:
        with self.changed:
            self.items.append(accepted)
            self.changed.notify_all()

    def wait_for(self, kind: type, count: int = 1, timeout_s: float = 10.0) -> list[Accepted]:
        """The announcements of ``kind`` heard, once there are ``count`` of them (or at the timeout)."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.of(kind)) >= count, timeout=timeout_s)
            return self.of(kind)

    def of(self, kind: type) -> list[Accepted]:
        return [a for a in self.items if isinstance(a.body, kind)]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Ledger, CoordinatorGossip, Heard, NodeIdentity]]:
    identity = NodeIdentity.generate()
    config = ledger_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")
    database = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
    ledger = Ledger(database, config, CountingPrompts(), identity.node_id)
    coordinator = CoordinatorGossip(identity, config, ledger.views, ORIGIN)
    heard = Heard()
    observer = Gossip(NodeIdentity.generate(), P2PConfig(), identity.node_id)
    observer.on("policy_version", heard)
    observer.on("tasks", heard)
    try:
        coordinator.start()
        observer.start()
        observer.join(coordinator.gossip.info())
        time.sleep(1.0)  # subscriptions exchanged
        yield ledger, coordinator, heard, identity
    finally:
        observer.stop()
        coordinator.stop()
        database.dispose()


def test_publications_and_waiting_tasks_are_announced(
    setup: tuple[Ledger, CoordinatorGossip, Heard, NodeIdentity],
) -> None:
    ledger, coordinator, heard, identity = setup
    signed = signed_manifest(identity, 0)
    ledger.publish(signed)
    policies = heard.wait_for(PolicyAnnouncement)
    assert len(policies) == 1 and policies[0].signer == identity.node_id
    body = policies[0].body
    assert isinstance(body, PolicyAnnouncement)
    assert (body.version, body.manifest_sha256, body.origin_url) == (0, manifest_digest(signed), ORIGIN)
    assert body.published_at == pytest.approx(time.time(), abs=5)
    deadline = time.monotonic() + 5  # set just after the announcement went out, which the observer may hear first
    while coordinator.announced_version != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert coordinator.announced_version == 0

    worker = NodeIdentity.generate().node_id
    ledger.register(worker, "127.0.0.1", register_request("worker"))
    assert heard.wait_for(TaskAnnouncement, timeout_s=2.0) == []  # leased on demand: nothing waits
    lease = ledger.lease(worker, LeaseRequest(max_tasks=1)).tasks[0]
    ledger.abandon(worker, lease.lease_id)
    tasks = heard.wait_for(TaskAnnouncement)
    assert [a.body for a in tasks] == [TaskAnnouncement(num_tasks_open=1, current_policy_version=0)]

    ledger.publish(signed_manifest(identity, 1))
    heard.wait_for(PolicyAnnouncement, count=2)
    time.sleep(0.5)  # the watcher keeps polling: a repeat would show up now
    versions = [a.body.version for a in heard.of(PolicyAnnouncement) if isinstance(a.body, PolicyAnnouncement)]
    assert versions == [0, 1]  # each publication announced once


def test_p2p_info_route(setup: tuple[Ledger, CoordinatorGossip, Heard, NodeIdentity]) -> None:
    _ledger, coordinator, _heard, identity = setup
    enabled, disabled = FastAPI(), FastAPI()
    for app, gossip in ((enabled, coordinator), (disabled, None)):
        install_error_handlers(app)
        mount_p2p_info(app, gossip)
    info = P2PInfo.model_validate(TestClient(enabled).get("/v1/p2p").json())
    assert info.peer_id == identity.node_id
    assert info.addrs and all(addr.endswith(f"/p2p/{identity.node_id}") for addr in info.addrs)
    response = TestClient(disabled).get("/v1/p2p")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found" and "p2p is disabled" in response.json()["detail"]


def test_disabled_p2p_starts_nothing(tmp_path: Path) -> None:
    config = ledger_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}", p2p__enabled=False)
    assert start_coordinator_gossip(NodeIdentity.generate(), config, None, FastAPI(), "http://x") is None  # type: ignore[arg-type]
