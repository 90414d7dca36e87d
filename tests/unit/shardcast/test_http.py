"""The shared HTTP app and the client library, in process (httpx.ASGITransport): no sockets.

A small transport routes each host name to its own app, so one test can run a good origin,
a corrupting one and a forging one side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.errors import IntegrityError, NotFoundError, RemoteUnavailableError
from protocol.identity import NodeIdentity
from shardcast.client.download import fetch_version
from shardcast.client.transfer import TransferOptions
from shardcast.format.manifest import load_verified_manifest
from shardcast.format.store import VersionStore
from shardcast.http.server import create_app
from shardcast.origin.publish import OriginSource, publish_checkpoint
from tests.support.shardcast_nodes import corrupt_shard

SHARD = 8192
pytestmark = pytest.mark.anyio
FAST = TransferOptions(num_parallel=4, backoff_base_s=0.01, backoff_max_s=0.05, fsync_enabled=False)


class HostRouter(httpx.AsyncBaseTransport):
    """Sends each request to the ASGI app registered for its host; unknown hosts refuse to connect."""

    def __init__(self, apps: dict[str, Any]) -> None:
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}
        self.requests: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.url.host}{request.url.path}")
        transport = self.transports.get(request.url.host)
        if transport is None:
            raise httpx.ConnectError(f"no route to {request.url.host}", request=request)
        return await transport.handle_async_request(request)


def make_checkpoint(directory: Path, size: int = 50_000) -> Path:
    (directory / "tokenizer").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(os.urandom(size))
    (directory / "config.json").write_text('{"hidden_size": 8}')
    (directory / "tokenizer" / "vocab.json").write_text('{"a": 0}')
    (directory / "empty.txt").write_bytes(b"")
    return directory


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client and relay are asyncio code


@pytest.fixture
def coordinator() -> NodeIdentity:
    return NodeIdentity.generate()


@pytest.fixture
def origin_store(tmp_path: Path, coordinator: NodeIdentity) -> VersionStore:
    store = VersionStore(tmp_path / "origin")
    publish_checkpoint(make_checkpoint(tmp_path / "ckpt"), 1, coordinator, store, shard_size_bytes=SHARD)
    return store


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and not p.name.startswith("."))
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and not p.name.startswith("."))
    return files_a == files_b and all((a / p).read_bytes() == (b / p).read_bytes() for p in files_a)


async def test_routes_and_refusals(origin_store: VersionStore) -> None:
    app = create_app(OriginSource(origin_store))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://origin") as http:
        listing = (await http.get("/versions")).json()
        assert listing["latest"] == 1 and listing["versions"][0]["num_shards"] == 7
        manifest = json.loads((await http.get("/v/1/manifest.json")).content)["manifest"]
        shard = await http.get("/v/1/shards/1")
        assert shard.status_code == 200 and len(shard.content) == SHARD
        assert shard.headers["accept-ranges"] == "bytes"
        assert shard.headers["etag"] == f'"{manifest["shards"][1]["hash"]}"'
        part = await http.get("/v/1/shards/1", headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == shard.content[10:20]
        assert part.headers["content-range"] == f"bytes 10-19/{SHARD}"
        tail = await http.get("/v/1/shards/1", headers={"Range": "bytes=-5"})
        assert tail.content == shard.content[-5:]
        head = await http.head("/v/1/shards/1")
        assert head.status_code == 200 and head.headers["content-length"] == str(SHARD) and head.content == b""
        refusals = {
            "/v/abc/manifest.json": (400, "malformed"),
            "/v/-1/shards/0": (400, "malformed"),
            "/v/99999999999999999999/shards/0": (400, "malformed"),
            "/v/7/manifest.json": (404, "not_found"),
            "/v/1/shards/7": (404, "not_found"),
            "/v/1/shards/x1": (400, "malformed"),
            "/nothing": (404, "http"),
        }
        for path, (status, code) in refusals.items():
            response = await http.get(path)
            assert (response.status_code, response.json()["error"]) == (status, code), path
            assert response.json()["detail"]
        bad_range = await http.get("/v/1/shards/0", headers={"Range": "bytes=oops"})
        assert bad_range.status_code == 400 and bad_range.json()["error"] == "bad_range"
        past_end = await http.get("/v/1/shards/0", headers={"Range": f"bytes={SHARD}-"})
        assert past_end.status_code == 416 and past_end.headers["content-range"] == f"bytes */{SHARD}"
        assert (await http.post("/versions")).status_code == 405
        assert (await http.get("/healthz")).json()["status"] == "ok"
        metrics = (await http.get("/metrics")).text
        assert 'shardcast_requests_total{route="shard",status="206"} 2.0' in metrics
        assert "shardcast_served_bytes_total" in metrics


async def test_client_downloads_verified_files_in_place(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    events: list[dict[str, Any]] = []
    durable = FAST.model_copy(update={"fsync_enabled": True})
    path = await fetch_version(
        1, ["http://origin"], coordinator.node_id, tmp_path / "out", durable, router, events.append
    )
    assert path == tmp_path / "out" / "v1"
    assert same_tree(path, tmp_path / "ckpt")
    assert (path / "empty.txt").stat().st_size == 0
    assert [e["event"] for e in events][:2] == ["start", "manifest"] and events[-1]["event"] == "done"
    assert not (tmp_path / "out" / ".partial-v1").exists()
    again: list[dict[str, Any]] = []
    await fetch_version(1, ["http://origin"], coordinator.node_id, tmp_path / "out", FAST, router, again.append)
    assert again[-1]["cached"] is True


async def test_corrupt_relay_is_detected_banned_and_routed_around(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    evil_store = VersionStore(tmp_path / "evil")
    shutil.copytree(origin_store.version_dir(1), evil_store.version_dir(1))
    for index in range(7):  # every shard corrupt: whatever the evil relay serves is caught
        corrupt_shard(evil_store.version_dir(1), index)
    router = HostRouter({"good": create_app(OriginSource(origin_store)), "evil": create_app(OriginSource(evil_store))})
    events: list[dict[str, Any]] = []
    path = await fetch_version(
        1, ["http://evil", "http://good"], coordinator.node_id, tmp_path / "out", FAST, router, events.append
    )
    assert same_tree(path, tmp_path / "ckpt")
    failures = [e for e in events if e["event"] == "shard_failed"]
    assert failures and all(e["source"] == "http://evil" and e["kind"] == "integrity" for e in failures)
    # banned at the first bad shard: only requests already in flight then can fail too
    assert len(failures) <= FAST.num_parallel
    assert all(e["source"] == "http://good" for e in events if e["event"] == "shard_done")
    relays = {r["url"]: r for r in events[-1]["relays"]}
    assert relays["http://evil"]["banned"] and not relays["http://good"]["banned"]


async def test_only_corrupt_sources_fail_with_integrity_error_and_expose_nothing(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    corrupt_shard(origin_store.version_dir(1), 3)
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    with pytest.raises(IntegrityError, match=r"shards/3: blake3 .* is not the signed hash"):
        await fetch_version(1, ["http://origin"], coordinator.node_id, tmp_path / "out", FAST, router)
    assert not (tmp_path / "out" / "v1").exists()


async def test_forged_manifest_is_refused(tmp_path: Path, origin_store: VersionStore) -> None:
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    someone_else = NodeIdentity.generate().node_id
    with pytest.raises(IntegrityError, match="signed by"):
        await fetch_version(1, ["http://origin"], someone_else, tmp_path / "out", FAST, router)
    assert not (tmp_path / "out" / "v1").exists()
    assert not any("shards" in request for request in router.requests)


async def test_missing_version_and_unreachable_relays(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    with pytest.raises(NotFoundError):
        await fetch_version(5, ["http://origin"], coordinator.node_id, tmp_path / "out", FAST, router)
    with pytest.raises(RemoteUnavailableError):
        await fetch_version(1, ["http://nowhere"], coordinator.node_id, tmp_path / "out", FAST, router)


class FailAfter(httpx.AsyncBaseTransport):
    """Passes ``budget`` shard requests through, then fails every one (an interrupted download)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, budget: int) -> None:
        self.inner = inner
        self.budget = budget

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "/shards/" in request.url.path:
            if self.budget <= 0:
                raise httpx.ReadError("connection reset", request=request)
            self.budget -= 1
        return await self.inner.handle_async_request(request)


async def test_interrupted_download_resumes_keeping_verified_shards(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    options = FAST.model_copy(update={"num_parallel": 1, "max_attempts_per_shard": 2})
    with pytest.raises(RemoteUnavailableError):
        await fetch_version(1, ["http://origin"], coordinator.node_id, tmp_path / "out", options, FailAfter(router, 4))
    assert (tmp_path / "out" / ".partial-v1").is_dir() and not (tmp_path / "out" / "v1").exists()
    events: list[dict[str, Any]] = []
    path = await fetch_version(1, ["http://origin"], coordinator.node_id, tmp_path / "out", FAST, router, events.append)
    resumed = next(e for e in events if e["event"] == "manifest")
    assert resumed["num_shards_resumed"] == 4
    assert sum(1 for e in events if e["event"] == "shard_done") == 3
    assert same_tree(path, tmp_path / "ckpt")


async def test_two_downloads_of_one_version_do_not_collide(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    out = tmp_path / "out"
    paths = await asyncio.gather(
        *(asyncio.to_thread(_download_blocking, coordinator.node_id, out, router) for _ in range(2))
    )
    assert paths[0] == paths[1] and same_tree(paths[0], tmp_path / "ckpt")


def _download_blocking(coordinator_id: str, out: Path, router: httpx.AsyncBaseTransport) -> Path:
    from shardcast.client.download import download_version

    return download_version(1, ["http://origin"], coordinator_id, out, FAST, router)


async def test_origin_app_mounts_under_a_prefix_as_the_coordinator_will(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    coordinator_app = Starlette(routes=[Mount("/shardcast", app=create_app(OriginSource(origin_store)))])
    router = HostRouter({"coordinator": coordinator_app})
    path = await fetch_version(1, ["http://coordinator/shardcast"], coordinator.node_id, tmp_path / "out", FAST, router)
    assert same_tree(path, tmp_path / "ckpt")
    assert "coordinator/shardcast/v/1/shards/0" in router.requests


async def test_a_local_write_failure_stops_the_transfer_instead_of_hanging(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    from protocol.errors import LocalFaultError
    from shardcast.client.fetchers import HttpxFetcher
    from shardcast.client.scoring import Scoreboard
    from shardcast.client.transfer import fetch_shards

    class FullDisk:
        location = tmp_path

        def open_shard(self, shard: Any) -> Any:
            raise OSError(28, "No space left on device")

    signed = load_verified_manifest(origin_store.manifest_path(1).read_bytes(), coordinator.node_id)
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    async with httpx.AsyncClient(transport=router) as http:
        with pytest.raises(LocalFaultError, match="No space left"):
            await asyncio.wait_for(
                fetch_shards(
                    HttpxFetcher(http),
                    signed.manifest,
                    signed.manifest.shards,
                    Scoreboard(["http://origin"]),
                    FullDisk(),
                    FAST,
                ),
                timeout=10,
            )


async def test_a_hedge_that_wins_is_never_overwritten_by_the_request_it_outran(
    tmp_path: Path, origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    """Two fetches of one shard run at once; the loser's bytes (maybe a liar's) must not land after the winner's."""
    from shardcast.client.download import _InPlaceSink, _PreallocatedFiles
    from shardcast.format.manifest import shard_spans

    manifest = load_verified_manifest(origin_store.manifest_path(1).read_bytes(), coordinator.node_id).manifest
    shard = manifest.shards[0]
    good = b"".join(
        (origin_store.version_dir(1) / "files" / span.path).read_bytes()[
            span.file_offset : span.file_offset + span.length
        ]
        for span in shard_spans(manifest, shard)
    )
    partial = tmp_path / "partial"
    files = _PreallocatedFiles(partial, manifest, create=True)
    sink = _InPlaceSink(files, manifest, partial)
    primary, hedge = sink.open_shard(shard), sink.open_shard(shard)
    primary.write(0, memoryview(b"\xff" * 100))
    hedge.write(0, memoryview(good))
    hedge.commit()
    primary.write(100, memoryview(b"\xff" * 100))  # still streaming when it was outrun: ignored
    primary.discard()
    assert files.matches(manifest, shard)
    files.close(sync=False)


class Mute(httpx.AsyncBaseTransport):
    """Accepts every request and never answers (a relay trickling its response head)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class FirstListed:
    """An rng for the scoreboard that always picks the first candidate: every primary goes to the mute source."""

    def choices(self, population: list[str], weights: object = None, k: int = 1) -> list[str]:
        return [population[0]] * k


class MemorySink:
    location = Path("/nonexistent")

    def __init__(self) -> None:
        self.committed: set[int] = set()

    def open_shard(self, shard: Any) -> Any:
        sink = self

        class Writer:
            def write(self, offset: int, data: memoryview) -> None:
                pass

            def commit(self) -> None:
                sink.committed.add(shard.index)

            def discard(self) -> None:
                pass

        return Writer()


async def test_fetches_waiting_for_a_hedge_slot_hedge_as_soon_as_one_frees(
    origin_store: VersionStore, coordinator: NodeIdentity
) -> None:
    """More shards drag on a mute source than hedges may run at once: each still hedges within seconds,
    none waits out its response timeout."""
    from shardcast.client.fetchers import HttpxFetcher
    from shardcast.client.scoring import Scoreboard
    from shardcast.client.transfer import fetch_shards

    manifest = load_verified_manifest(origin_store.manifest_path(1).read_bytes(), coordinator.node_id).manifest
    assert len(manifest.shards) >= 4
    router = HostRouter({"origin": create_app(OriginSource(origin_store))})
    router.transports["mute"] = Mute()  # type: ignore[assignment]
    options = FAST.model_copy(
        update={"num_parallel": 8, "max_hedges": 1, "hedge_after_s": 0.05, "response_timeout_s": 60.0}
    )
    scoreboard = Scoreboard(["http://mute", "http://origin"], rng=FirstListed())  # type: ignore[arg-type]
    sink = MemorySink()
    async with httpx.AsyncClient(transport=router) as http:
        await asyncio.wait_for(
            fetch_shards(HttpxFetcher(http), manifest, manifest.shards, scoreboard, sink, options), timeout=20
        )
    assert sink.committed == {shard.index for shard in manifest.shards}
