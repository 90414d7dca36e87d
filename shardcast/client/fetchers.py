"""How shard bodies travel: through any httpx transport, or a lean socket reader for plain http://.

The engine (:mod:`shardcast.client.transfer`) asks a :class:`ShardFetcher` for one URL and gets
the body in pieces, each handed to a callback that hashes and writes it before the next piece
is read. Two implementations:

- :class:`HttpxFetcher` works over any httpx client, so tests can inject an in-process
  transport (``httpx.ASGITransport``) and https URLs work.
- :class:`SocketFetcher` speaks just enough HTTP/1.1 (GET, Content-Length bodies,
  keep-alive) to read bodies with ``recv_into`` straight into one reused 1 MiB buffer
  (an :class:`asyncio.BufferedProtocol`): no per-64-KiB object churn, which on a busy
  machine is most of what a Python download costs. Control requests (versions, manifests)
  stay on httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, cast
from urllib.parse import urlsplit

import httpx

from shardcast.client.progress import ProgressDeadline, with_progress_deadline

BodyConsumer = Callable[[memoryview], None]
_RECV_BUFFER_BYTES = 1024 * 1024
_MAX_HEADER_BYTES = 64 * 1024


class FetchTransportError(OSError):
    """The connection failed or the server spoke something other than the HTTP we expect."""


class CutShortError(FetchTransportError):
    """A 200 response whose body ended before the length its head declared (the connection closed)."""


class ShardFetcher(Protocol):
    async def get(self, url: str, consume: BodyConsumer) -> int:
        """GET ``url``; for a 200, feed the body to ``consume`` piece by piece. Returns the status code."""
        ...

    async def aclose(self) -> None: ...


class HttpxFetcher:
    def __init__(self, http: httpx.AsyncClient, owns_client: bool = False) -> None:
        self.http = http
        self.owns_client = owns_client

    async def get(self, url: str, consume: BodyConsumer) -> int:
        async with self.http.stream("GET", url, headers={"Accept-Encoding": "identity"}) as response:
            if response.status_code == 200:
                try:
                    async for chunk in response.aiter_raw():
                        consume(memoryview(chunk))
                except httpx.RemoteProtocolError as exc:  # h11: the peer closed before the declared length
                    raise CutShortError(f"{url}: {exc}") from exc
            return response.status_code

    async def aclose(self) -> None:
        if self.owns_client:
            await self.http.aclose()


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; the transport reads into ``buffer`` until it is consumed."""

    def __init__(self) -> None:
        self.buffer = bytearray(_RECV_BUFFER_BYTES)
        self.view = memoryview(self.buffer)
        self.filled = 0
        self.closed = False
        self.paused = False
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.buffer) and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for_data(self, timeout_s: float, have: int = 0) -> None:
        """Return once more than ``have`` unconsumed bytes are buffered, or the peer closed; TimeoutError after
        ``timeout_s``. A reader that needs more than it has (a response head cut mid-way) passes what it has,
        or it would spin on the bytes already there without ever yielding to the event loop."""
        if self.filled > have or self.closed:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._waiter, timeout_s)
        finally:
            self._waiter = None

    def consumed(self, num_bytes: int) -> None:
        """Drop the first ``num_bytes`` buffered bytes and let the transport read again."""
        rest = self.filled - num_bytes
        if rest:
            self.buffer[:rest] = self.buffer[num_bytes : self.filled]
        self.filled = rest
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class SocketFetcher:
    """GETs over raw asyncio connections, kept alive per host (plain http:// only)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def _connect(self, host: str, port: int) -> _Connection:
        idle = self._idle.get((host, port), [])
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, host, port), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise FetchTransportError(f"cannot connect to {host}:{port}: {exc or type(exc).__name__}") from exc
        return connection

    async def get(self, url: str, consume: BodyConsumer) -> int:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise FetchTransportError(f"{url}: SocketFetcher speaks plain http:// only")
        host, port = parts.hostname, parts.port or 80
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection = await self._connect(host, port)
        reusable = False
        try:
            assert connection.transport is not None
            request = f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept-Encoding: identity\r\n\r\n"
            connection.transport.write(request.encode("latin-1"))
            status, length, keep_alive = await self._read_head(connection, url)
            if status != 200:
                return status
            await self._read_body(connection, length, consume, url)
            reusable = keep_alive
            return status
        except TimeoutError as exc:
            raise FetchTransportError(f"{url}: no data for {self.read_timeout_s:.0f} s") from exc
        finally:
            if reusable and not connection.closed:
                self._idle.setdefault((host, port), []).append(connection)
            else:
                connection.close()

    async def _read_head(self, connection: _Connection, url: str) -> tuple[int, int, bool]:
        while True:
            end = connection.buffer.find(b"\r\n\r\n", 0, connection.filled)
            if end >= 0:
                break
            if connection.closed or connection.filled >= _MAX_HEADER_BYTES:
                raise FetchTransportError(f"{url}: connection closed or oversized before the response head")
            await connection.wait_for_data(self.read_timeout_s, have=connection.filled)
        head = bytes(connection.view[:end]).decode("latin-1").split("\r\n")
        connection.consumed(end + 4)
        status_line = head[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise FetchTransportError(f"{url}: not an HTTP/1.x response: {head[0][:80]!r}")
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line[1])
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise FetchTransportError(f"{url}: chunked responses are not expected from a SHARDCAST server")
        length_text = headers.get("content-length", "")
        if not length_text.isdigit():
            if status != 200:
                return status, 0, False
            raise FetchTransportError(f"{url}: response without Content-Length")
        keep_alive = headers.get("connection", "").lower() != "close" and status_line[0] == "HTTP/1.1"
        return status, int(length_text), keep_alive and status == 200

    async def _read_body(self, connection: _Connection, length: int, consume: BodyConsumer, url: str) -> None:
        left = length
        while left > 0:
            if not connection.filled:
                if connection.closed:
                    raise CutShortError(f"{url}: connection closed with {left} of {length} bytes unread")
                await connection.wait_for_data(self.read_timeout_s)
                continue
            take = min(left, connection.filled)
            consume(connection.view[:take])
            left -= take
            connection.consumed(take)

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()


def open_fetcher(
    urls: Sequence[str],
    transport: httpx.AsyncBaseTransport | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_connections: int = 64,
) -> ShardFetcher:
    """A fetcher for ``urls``: the socket reader when all are plain http:// (no httpx client, no CA
    bundle to load: a client starts faster), httpx for https:// ones or when a transport is injected."""
    plain = all(url.startswith("http://") for url in urls)
    if transport is None and plain:
        return SocketFetcher(connect_timeout_s, read_timeout_s)
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        transport=transport,
    )
    through_httpx = HttpxFetcher(http, owns_client=True)
    if transport is not None:
        return through_httpx
    return _SchemeRouter(through_httpx, SocketFetcher(connect_timeout_s, read_timeout_s))


async def get_bytes(
    fetcher: ShardFetcher, url: str, max_bytes: int, deadline: ProgressDeadline | None = None
) -> tuple[int, bytes]:
    """GET a small document (a manifest): the status and, for a 200, the body (at most ``max_bytes``).

    Under ``deadline`` a source too slow to answer raises :class:`~shardcast.client.progress.TooSlowError`."""
    parts: list[bytes] = []
    size = 0

    def collect(chunk: memoryview) -> None:
        nonlocal size
        size += len(chunk)
        if size > max_bytes:
            raise FetchTransportError(f"{url}: more than {max_bytes} bytes")
        parts.append(bytes(chunk))

    request = fetcher.get(url, collect)
    status = await (request if deadline is None else with_progress_deadline(request, lambda: size, deadline, url))
    return status, b"".join(parts)


async def get_bounded(http: httpx.AsyncClient, url: str, max_bytes: int) -> bytes:
    """GET a small control document (a listing) through httpx: its body, once the status is 2xx, never more than
    ``max_bytes`` read (a declared or streamed larger body raises :class:`httpx.HTTPError`)."""
    async with http.stream("GET", url) as response:
        response.raise_for_status()
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise httpx.DecodingError(f"{url}: declares {declared} bytes, more than {max_bytes}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise httpx.DecodingError(f"{url}: more than {max_bytes} bytes")
        return bytes(body)


class _SchemeRouter:
    """Plain http:// through the socket reader, anything else (https://) through httpx."""

    def __init__(self, fallback: HttpxFetcher, plain: SocketFetcher) -> None:
        self.fallback = fallback
        self.plain = plain

    async def get(self, url: str, consume: BodyConsumer) -> int:
        if url.startswith("http://"):
            return await self.plain.get(url, consume)
        return await self.fallback.get(url, consume)

    async def aclose(self) -> None:
        await self.plain.aclose()
        await self.fallback.aclose()
