"""``GET /v1/p2p`` names a gossip address each asker can dial, also when the coordinator binds 0.0.0.0."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from coordinator.serving.p2p import mount_p2p_info
from protocol.identity import load_or_create_identity
from runtime.p2p.config import P2PConfig
from runtime.p2p.gossip import Gossip

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def app_bound_to(tmp_path: Path, host: str, public_host: str | None) -> tuple[FastAPI, str]:
    identity = load_or_create_identity(tmp_path)
    gossip = Gossip(identity, P2PConfig(host=host, port=4001, public_host=public_host), None)
    gossip.node.addrs = [f"/ip4/{host}/tcp/4001/p2p/{identity.node_id}"]  # as a started node lists them
    app = FastAPI()
    mount_p2p_info(app, SimpleNamespace(gossip=gossip))  # type: ignore[arg-type]
    return app, identity.node_id


async def addrs_seen_at(app: FastAPI, base_url: str) -> list[str]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url) as client:
        response = await client.get("/v1/p2p")
    assert response.status_code == 200
    return list(response.json()["addrs"])


async def test_a_wildcard_bind_is_named_as_each_asker_reached_the_api(tmp_path: Path) -> None:
    app, peer = app_bound_to(tmp_path, "0.0.0.0", None)
    assert await addrs_seen_at(app, "http://10.200.2.2:8000") == [f"/ip4/10.200.2.2/tcp/4001/p2p/{peer}"]
    assert await addrs_seen_at(app, "http://coord.example.org:8000") == [f"/dns/coord.example.org/tcp/4001/p2p/{peer}"]


async def test_a_public_host_or_a_specific_bind_is_kept(tmp_path: Path) -> None:
    app, peer = app_bound_to(tmp_path / "a", "0.0.0.0", "203.0.113.7")
    assert await addrs_seen_at(app, "http://10.200.2.2:8000") == [f"/ip4/203.0.113.7/tcp/4001/p2p/{peer}"]
    app, peer = app_bound_to(tmp_path / "b", "10.0.0.5", None)
    assert await addrs_seen_at(app, "http://10.200.2.2:8000") == [f"/ip4/10.0.0.5/tcp/4001/p2p/{peer}"]
