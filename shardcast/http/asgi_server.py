"""A small HTTP/1.1 server for the SHARDCAST ASGI app, with zero-copy file bodies.

The app (:func:`shardcast.http.server.create_app`) is the one home of the routes; uvicorn can host
it (the coordinator mounts it in its own app), and so can this server, which the standalone
origin and relay use because it implements the ASGI *zero-copy send* extension
(``http.response.zerocopysend``): shard bodies go from the page cache to the socket with
``sendfile(2)`` (``loop.sendfile``), never through Python buffers. On a machine where every
core also hashes and writes, that copy is what serving costs.

Scope, on purpose: one request at a time per connection (no pipelining), keep-alive, no
request bodies (SHARDCAST has no route that takes one: a request announcing one gets 413),
bodies delimited by Content-Length (else the connection closes after the body). Heads are
capped at 64 KiB; a connection idle for ``IDLE_TIMEOUT_S`` between requests is closed. HEAD
responses carry no body whatever the app sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
from typing import Any, cast
from urllib.parse import unquote

from starlette.types import ASGIApp, Message

from protocol.errors import StartupError

log = logging.getLogger("shardcast.http")
_MAX_HEAD_BYTES = 64 * 1024
IDLE_TIMEOUT_S = 75.0
_REASONS = {200: "OK", 206: "Partial Content", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 416: "Range Not Satisfiable", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip


class _Connection(asyncio.Protocol):
    def __init__(self, app: ASGIApp, server_addr: tuple[str, int]) -> None:
        self.app = app
        self.server_addr = server_addr
        self.loop = asyncio.get_running_loop()
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = self.loop.create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()
        elif len(self.buffer) > 2 * _MAX_HEAD_BYTES and self.transport is not None:
            self.transport.close()  # a client flooding us while its request is served

    def _arm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self.transport is not None:
            self._idle_timer = self.loop.call_later(IDLE_TIMEOUT_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- requests ------------------------------------------------------------------------------

    def _next_request(self) -> None:
        assert self.transport is not None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_HEAD_BYTES:
                self._reply_and_close(431, b"request head too large")
            return
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._reply_and_close(400, b"malformed request line")
            return
        method, target, version = parts
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self._reply_and_close(400, b"malformed header line")
                return
            headers.append((name.strip().lower().encode("latin-1"), value.strip().encode("latin-1")))
        names = dict(headers)
        if names.get(b"transfer-encoding") or names.get(b"content-length", b"0") not in (b"0", b""):
            self._reply_and_close(413, b"this server takes no request bodies")
            return
        keep_alive = version == "HTTP/1.1" and names.get(b"connection", b"").lower() != b"close"
        path, _, query = target.partition("?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version[5:],
            "method": method.upper(),
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": headers,
            "client": self.transport.get_extra_info("peername"),
            "server": self.server_addr,
            "extensions": {"http.response.zerocopysend": {}},
        }
        self.busy = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._task = self.loop.create_task(self._serve(scope, keep_alive))  # held: the loop keeps weak refs

    async def _serve(self, scope: dict[str, Any], keep_alive: bool) -> None:
        exchange = _Exchange(self, scope["method"] == "HEAD", keep_alive)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except (ConnectionError, OSError) as exc:
            log.debug("client went away: %s", exc)
            exchange.keep_alive = False
        except Exception:
            log.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            if not exchange.started:
                self._reply_and_close(500, b"internal error")
                return
            exchange.keep_alive = False
        if not exchange.finished:
            exchange.keep_alive = False
        if exchange.keep_alive and self.transport is not None and not self.transport.is_closing():
            self.busy = False
            self._arm_idle_timer()
            if self.buffer:
                self._next_request()
        elif self.transport is not None:
            self.transport.close()

    def _reply_and_close(self, status: int, reason: bytes) -> None:
        assert self.transport is not None
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: text/plain\r\n"
        head += f"content-length: {len(reason)}\r\nconnection: close\r\n\r\n"
        self.transport.write(head.encode("latin-1") + reason)
        self.transport.close()

    async def drain(self) -> None:
        await self._writable.wait()
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("client closed the connection")


class _Exchange:
    """The ``receive`` and ``send`` of one request."""

    def __init__(self, connection: _Connection, is_head: bool, keep_alive: bool) -> None:
        self.connection = connection
        self.is_head = is_head
        self.keep_alive = keep_alive
        self.started = False
        self.finished = False
        self.request_read = False

    async def receive(self) -> Message:
        if not self.request_read:
            self.request_read = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.connection.closed
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        transport = self.connection.transport
        assert transport is not None
        kind = message["type"]
        if kind == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            if not any(name == b"content-length" for name, _ in headers):
                self.keep_alive = False  # the body ends when the connection does
            lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}".encode("latin-1")]
            lines += [name + b": " + value for name, value in headers]
            lines.append(b"connection: keep-alive" if self.keep_alive else b"connection: close")
            transport.write(b"\r\n".join(lines) + b"\r\n\r\n")
            self.started = True
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if body and not self.is_head:
                transport.write(body)
                await self.connection.drain()
            self.finished = not message.get("more_body", False)
        elif kind == "http.response.zerocopysend":
            if not self.is_head and message.get("count", 1) != 0:
                await self.connection.drain()
                await self.connection.loop.sendfile(
                    transport, message["file"], message.get("offset", 0), message.get("count"), fallback=True
                )
            self.finished = not message.get("more_body", False)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")


async def serve_asgi(app: ASGIApp, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve ``app`` on host:port until ``stop`` is set or the process gets SIGINT/SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    try:
        server = await loop.create_server(lambda: _Connection(app, (host, port)), host, port, reuse_address=True)
    except OSError as exc:
        in_use = exc.errno == errno.EADDRINUSE
        raise StartupError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "another program uses that port: stop it, or pick another with --port"
            if in_use
            else "pick an address of this machine with --host (0.0.0.0 for all) and a free port with --port",
        ) from exc
    log.debug("serving on %s:%d (pid %d)", host, port, os.getpid())
    try:
        await stop.wait()
    finally:
        server.close()
