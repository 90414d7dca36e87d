"""The zero-copy HTTP server on a loopback socket: keep-alive, HEAD, ranges, refusals."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from protocol.identity import NodeIdentity
from runtime.ports import free_port
from shardcast.format.store import VersionStore
from shardcast.http.asgi_server import serve_asgi
from shardcast.http.server import create_app
from shardcast.origin.publish import OriginSource, publish_checkpoint

pytestmark = pytest.mark.anyio
SHARD = 64 * 1024


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _exchange(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, request: bytes) -> tuple[str, bytes]:
    writer.write(request)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next(int(line.split(":")[1]) for line in head.split("\r\n") if line.lower().startswith("content-length"))
    body = await reader.readexactly(length) if not request.startswith(b"HEAD") else b""
    return head, body


async def test_keep_alive_zero_copy_ranges_and_refusals(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    data = os.urandom(3 * SHARD + 5)
    (checkpoint / "model.safetensors").write_bytes(data)
    store = VersionStore(tmp_path / "store")
    publish_checkpoint(checkpoint, 1, NodeIdentity.generate(), store, shard_size_bytes=SHARD, fsync_enabled=False)
    port, stop = free_port(), asyncio.Event()
    server = asyncio.create_task(serve_asgi(create_app(OriginSource(store)), "127.0.0.1", port, stop))
    try:
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.02)
        # several requests on one connection
        head, body = await _exchange(writer, reader, b"GET /v/1/shards/1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith("HTTP/1.1 200") and "connection: keep-alive" in head and body == data[SHARD : 2 * SHARD]
        head, body = await _exchange(writer, reader, b"GET /v/1/shards/3 HTTP/1.1\r\nRange: bytes=1-3\r\n\r\n")
        assert head.startswith("HTTP/1.1 206") and body == data[3 * SHARD + 1 : 3 * SHARD + 4]
        head, body = await _exchange(writer, reader, b"HEAD /v/1/shards/0 HTTP/1.1\r\n\r\n")
        assert head.startswith("HTTP/1.1 200") and f"content-length: {SHARD}" in head
        head, body = await _exchange(writer, reader, b"GET /v/1/shards/9 HTTP/1.1\r\n\r\n")
        assert head.startswith("HTTP/1.1 404") and b"out of range" in body
        head, body = await _exchange(writer, reader, b"GET /v/1/shards/0 HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert "connection: close" in head and body == data[:SHARD]
        assert await reader.read() == b""
        writer.close()
        for request, status in [
            (b"NONSENSE\r\n\r\n", "400"),
            (b"POST /versions HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", "413"),
            (b"GET /v/1/shards/0 HTTP/1.1\r\nno-colon-here\r\n\r\n", "400"),
        ]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head, _ = await _exchange(writer, reader, request)
            assert head.split(" ")[1] == status, (request, head)
            writer.close()
    finally:
        stop.set()
        await server
