"""Documents a relay sends (manifests, listings) are bounded while they stream in, before they are parsed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from protocol.errors import PrimeError, ProtocolError, RemoteUnavailableError
from protocol.identity import NodeIdentity
from shardcast.client.download import download_version, latest_version
from shardcast.format.manifest import MAX_LISTING_BYTES, MAX_MANIFEST_BYTES
from shardcast.format.store import VersionStore
from shardcast.origin import publish as origin_module
from shardcast.origin.publish import publish_checkpoint


def serving(body: bytes, counter: list[int]) -> httpx.ASGITransport:
    """An in-process server answering every GET with ``body`` (streamed in 1 MiB pieces)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        counter.append(len(body))
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for start in range(0, len(body), 1 << 20):
            await send({"type": "http.response.body", "body": body[start : start + (1 << 20)], "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return httpx.ASGITransport(app=cast(Any, app))


def test_a_manifest_over_the_limit_is_refused_while_it_streams(tmp_path: Path) -> None:
    # a signed-looking document of many shards, one byte past what a node reads
    entry = b'{"index":0,"offset":0,"size_bytes":1,"hash":"' + b"0" * 64 + b'"},'
    body = b'{"manifest":{"shards":[' + entry * (MAX_MANIFEST_BYTES // len(entry) + 1) + b"]}}"
    served: list[int] = []
    with pytest.raises(PrimeError, match=f"more than {MAX_MANIFEST_BYTES} bytes"):
        download_version(
            1, ["http://relay"], NodeIdentity.generate().node_id, tmp_path, transport=serving(body, served)
        )
    assert served


def test_a_listing_over_the_limit_is_no_answer() -> None:
    infos = [{"version": i, "num_shards": 1, "num_shards_ready": 1, "total_size_bytes": 1} for i in range(1024)]
    listing = {"role": "relay", "latest": 7, "versions": infos}
    padded = json.dumps(listing).encode() + b" " * MAX_LISTING_BYTES  # valid JSON, too long
    with pytest.raises(RemoteUnavailableError, match="no relay answered"):
        asyncio.run(latest_version(["http://relay"], transport=serving(padded, [])))
    assert asyncio.run(latest_version(["http://relay"], transport=serving(json.dumps(listing).encode(), []))) == 7


def test_the_origin_refuses_to_publish_a_manifest_no_node_would_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.bin").write_bytes(bytes(64 * 4096))
    monkeypatch.setattr(origin_module, "MAX_MANIFEST_BYTES", 8 * 1024)  # 64 shards' entries do not fit
    store = VersionStore(tmp_path / "store")
    with pytest.raises(ProtocolError, match="larger shard_size_bytes"):
        publish_checkpoint(checkpoint, 1, NodeIdentity.generate(), store, shard_size_bytes=4096)
    assert store.versions() == []
