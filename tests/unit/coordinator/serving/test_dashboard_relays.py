"""The dashboard's relays: URLs heard on gossip, asked for ``/versions`` in the background, shown per version.

A real HTTP server on 127.0.0.1 plays several relays at once (one per path prefix): one
answers well, others answer malformed (lax types, unknown fields), oversize, with a redirect,
as an origin, or hold their answer past the timeout; one URL points at a port nothing listens
on. The dashboard, served in-process over the real ledger, must count only the good relay per
version, show each other one as unreachable with why, and answer while a probe is in flight.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi import FastAPI

from coordinator.serving.app import create_app
from coordinator.serving.dashboard.relays import (
    FORGET_AFTER_S,
    MAX_ANSWER_BYTES,
    MAX_RELAYS,
    NEW_RELAY_INTERVAL_S,
    RelayWatch,
    relay_url,
)
from protocol.announcements import Accepted
from protocol.identity import NodeIdentity
from protocol.schemas import Dashboard, RelayAnnouncement, TaskAnnouncement
from runtime.ports import free_port
from tests.support.ledger_helpers import FakeClock, signed_manifest
from tests.support.shardcast_nodes import wait_until
from tests.unit.coordinator.conftest import LedgerHarness

pytestmark = pytest.mark.anyio

GOOD = {
    "v": 1,
    "role": "relay",
    "latest": 1,
    "versions": [
        {"v": 1, "version": 0, "num_shards": 3, "num_shards_ready": 3, "total_size_bytes": 300},
        {"v": 1, "version": 1, "num_shards": 3, "num_shards_ready": 1, "total_size_bytes": 300},
    ],
}
ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/good/versions": (200, {}, json.dumps(GOOD).encode()),
    "/lax/versions": (200, {}, json.dumps({**GOOD, "latest": "1"}).encode()),  # a string where an int belongs
    "/extra/versions": (200, {}, json.dumps({**GOOD, "script": "<b>x</b>"}).encode()),
    "/origin/versions": (200, {}, json.dumps({**GOOD, "role": "origin"}).encode()),
    "/garbage/versions": (200, {}, b"<html>not json</html>"),
    "/redirect/versions": (302, {"location": "/good/versions"}, b""),
    "/error/versions": (500, {}, b"{}"),
}
HUGE = b'{"v": 1, "role": "relay", "latest": 0, "versions": [' + b" " * (MAX_ANSWER_BYTES + 1) + b"]}"


class FakeRelays(BaseHTTPRequestHandler):
    """Answers ``ANSWERS``; ``/huge`` streams an oversize body with no length; ``/held`` waits for ``release``."""

    release = threading.Event()
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        if self.path == "/huge/versions":
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(ConnectionError):  # the client hangs up once it has seen too much
                self.wfile.write(HUGE)  # no content-length: only counting what arrives can stop it
            return
        if self.path == "/held/versions":
            self.release.wait(30)
        status, headers, body = ANSWERS.get(self.path, ANSWERS["/good/versions"])
        self.send_response(status)
        for key, value in {**headers, "content-length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_relays() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRelays)
    server.daemon_threads = True
    FakeRelays.release.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        FakeRelays.release.set()
        server.shutdown()
        server.server_close()


def announced(watch: RelayWatch, url: str) -> None:
    signer = NodeIdentity.generate().node_id
    watch.on_announcement(Accepted("relay", signer, 0.0, RelayAnnouncement(url=url, latest_version=None)))


async def dashboard(app: FastAPI) -> Dashboard:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ledger") as http:
        response = await http.get("/v1/dashboard")
    assert response.status_code == 200, response.text
    return Dashboard.model_validate_json(response.content)


async def test_relays_are_asked_in_the_background_and_counted_per_version(
    harness: LedgerHarness, fake_relays: str
) -> None:
    coordinator = harness.client(harness.coordinator)
    for version in (0, 1):
        await coordinator.publish(signed_manifest(harness.coordinator, version))
    watch = RelayWatch(clock=harness.clock, interval_s=0.2, timeout_s=2.0)
    app = create_app(harness.config, harness.ledger, harness.replay_cache, watch)
    bad = ["lax", "extra", "origin", "garbage", "redirect", "error", "huge"]
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ["held", *bad, "good"]:
        announced(watch, f"{fake_relays}/{name}")
        harness.clock.advance(1)
    announced(watch, dead + "/")  # a trailing slash is dropped
    watch.on_announcement(Accepted("tasks", "x", 0.0, TaskAnnouncement(num_tasks_open=1, current_policy_version=0)))
    watch.start()
    try:
        others = [f"{fake_relays}/{name}" for name in [*bad, "good"]] + [dead]
        wait_until(lambda: all(r.checked_at is not None for r in watch.relays() if r.url in others), 20, "probes")
        during = await dashboard(app)  # answered while the held relay's probe is still in flight
        by_url = {r.url: r for r in during.relays}
        assert [r.url for r in during.relays] == [dead, *reversed(others[:-1]), f"{fake_relays}/held"]
        assert by_url[f"{fake_relays}/held"].checked_at is None
        good = by_url[f"{fake_relays}/good"]
        assert (good.reachable, good.error, good.versions_held, good.versions_mirroring) == (True, None, [0], [1])
        assert good.answered_at == good.checked_at == harness.clock()
        reasons = {url.rsplit("/", 1)[1]: (r.reachable, r.error, r.answered_at) for url, r in by_url.items()}
        assert reasons["lax"] == reasons["extra"] == reasons["garbage"] == (False, "malformed answer", None)
        assert reasons["origin"] == (False, "answers as origin, not relay", None)
        assert reasons["redirect"] == (False, "redirect (302) refused", None)
        assert reasons["error"] == (False, "HTTP 500", None)
        assert reasons["huge"] == (False, f"answer over {MAX_ANSWER_BYTES} bytes", None)
        assert reasons[dead.rsplit("/", 1)[1]] == (False, "connection failed (ConnectError)", None)
        v1, v0 = during.versions
        assert (v0.version, v0.num_relays, v1.version, v1.num_relays) == (0, 1, 1, 0)  # v1 is still mirroring

        wait_until(lambda: watch.relays()[-1].error == "timed out", 20, "the held relay to time out")
        FakeRelays.release.set()  # now it answers in time
        wait_until(lambda: watch.relays()[-1].reachable, 20, "the held relay to answer")
        after = await dashboard(app)
        assert [v.num_relays for v in after.versions] == [0, 2]
    finally:
        watch.stop()


def test_only_plain_announced_urls_are_kept_newest_first_and_capped() -> None:
    clock = FakeClock()
    watch = RelayWatch(clock=clock, max_relays=3)
    refused_urls = ("ftp://relay", "http://user:pw@relay", "http://relay/?q=1", "http://relay/#x", "javascript:1")
    for refused in (*refused_urls, "http://a b", "http://relay/\x00"):
        assert watch.heard(refused, "signer") is False
        assert relay_url(refused) is None
    for i in range(5):
        assert watch.heard(f"https://relay-{i}.example:8443/", f"signer-{i}")
        clock.advance(1)
    assert [r.url for r in watch.relays()] == [f"https://relay-{i}.example:8443" for i in (4, 3, 2)]
    watch.heard("https://moved.example", "signer-3")  # a relay's new URL replaces its old one
    assert [r.url for r in watch.relays()] == [
        "https://moved.example",
        "https://relay-4.example:8443",
        "https://relay-2.example:8443",
    ]
    clock.advance(FORGET_AFTER_S + 1)  # no longer announcing: forgotten
    assert watch.relays() == []


def test_new_relay_urls_are_admitted_at_a_bounded_rate() -> None:
    clock = FakeClock()
    watch = RelayWatch(clock=clock)
    assert all(watch.heard(f"http://10.0.0.{i}:8000", f"signer-{i}") for i in range(MAX_RELAYS))
    assert watch.heard("http://10.0.1.1:8000", "another") is False  # the burst is spent
    assert watch.heard("http://10.0.0.3:8000", "signer-3") is True  # re-announcing a known relay always counts
    clock.advance(NEW_RELAY_INTERVAL_S)
    assert watch.heard("http://10.0.1.1:8000", "another") is True
    assert watch.heard("http://10.0.1.2:8000", "yet-another") is False
    assert len(watch.relays()) == MAX_RELAYS and watch.relays()[0].url == "http://10.0.1.1:8000"
    assert all(not r.reachable and r.checked_at is None for r in watch.relays())
