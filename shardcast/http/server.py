"""The HTTP face of SHARDCAST, shared by the origin and every relay: one ASGI app, any source.

Routes (all GET, shards also HEAD)::

    /healthz                    liveness, what is held, and why a relay is stuck (status "degraded")
    /metrics                    Prometheus text
    /versions                   VersionsResponse: latest version and the list (a hint, unsigned)
    /v/{N}/manifest.json        the signed manifest, byte for byte as the coordinator signed it
    /v/{N}/shards/{i}           shard bytes; single Range requests supported (206 / 416)

Plain HTTP, so ``curl -O http://relay/v/3/shards/0`` works, and shards are immutable, so any
HTTP cache may front a server. What is served comes from a :class:`ShardSource`: the origin's
published store or a relay's mirror (which may hold a request for a shard it is still
verifying). A shard is served from :class:`Segment` s: the relay's shard file, or the parts of
the origin's checkpoint files it covers. Bad input gets a 4xx with a JSON ``ErrorBody`` saying
why; files are streamed in 1 MiB slices from already-open descriptors (or handed to the server
whole when it supports the ASGI zero-copy send extension, as :mod:`shardcast.http.asgi_server`
does), so pruning a version never cuts a response short.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from protocol.errors import NotFoundError, NotReadyError, PrimeError, ProtocolError
from protocol.schemas import ErrorBody, ShardEntry, VersionsResponse
from runtime.http_metrics import RequestMetrics
from shardcast.http.asgi_server import serve_asgi
from shardcast.http.metrics import ShardcastMetrics
from shardcast.http.ranges import MalformedRange, RangeError, parse_range

CHUNK_BYTES = 1024 * 1024
_MAX_VERSION = 2**62


@dataclass(frozen=True)
class Segment:
    """``length`` bytes at ``offset`` of the file at ``path``: a piece of a shard as stored."""

    path: Path
    offset: int
    length: int


def slice_segments(segments: list[Segment], start: int, length: int) -> list[Segment]:
    """The pieces of ``segments`` (laid end to end) that cover bytes [start, start + length)."""
    pieces: list[Segment] = []
    position = 0
    for segment in segments:
        lo = max(start, position)
        hi = min(start + length, position + segment.length)
        if lo < hi:
            pieces.append(Segment(segment.path, segment.offset + lo - position, hi - lo))
        position += segment.length
    return pieces


class ShardSource(Protocol):
    """What a server serves from; implemented by the origin and by the relay."""

    role: Literal["origin", "relay"]
    metrics: ShardcastMetrics

    def versions_response(self) -> VersionsResponse: ...

    def health_problems(self) -> list[str]:
        """Why this source cannot do its job right now, one line each; empty when it can."""
        ...

    def manifest_bytes(self, version: int) -> bytes:
        """The signed manifest as stored; NotFoundError if the version is not held."""
        ...

    async def shard_segments(self, version: int, index: int) -> tuple[list[Segment], ShardEntry]:
        """Where a verified shard's bytes lie, in order; NotFoundError, or NotReadyError while still mirrored."""
        ...


def parse_index(text: str, what: str) -> int:
    """A non-negative decimal integer from a path segment; ProtocolError (400) otherwise."""
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise ProtocolError(f"{what} must be a non-negative integer, got {text[:40]!r}")
    value = int(text)
    if value > _MAX_VERSION:
        raise ProtocolError(f"{what} {value} is out of range")
    return value


def error_response(status_code: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, detail=detail).model_dump(mode="json")
    return JSONResponse(body, status_code=status_code, headers=headers)


class FileSliceResponse(Response):
    """Streams pieces of already-open files in order, stopping when the client goes away."""

    def __init__(
        self,
        parts: list[tuple[int, int, int]],
        fds: list[int],
        status_code: int,
        headers: dict[str, str],
        send_body: bool,
        metrics: ShardcastMetrics,
    ) -> None:
        super().__init__(status_code=status_code, headers=headers, media_type="application/octet-stream")
        self.length = sum(length for _, _, length in parts)
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.raw_headers.append((b"content-length", str(self.length).encode()))
        self.parts = parts
        """(fd, offset, length) of each piece, in body order."""
        self.fds = fds
        self.send_body = send_body
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if not self.send_body or self.length == 0:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if "http.response.zerocopysend" in scope.get("extensions", {}):
                for number, (fd, offset, length) in enumerate(self.parts):
                    with open(fd, "rb", closefd=False) as file:
                        more = number < len(self.parts) - 1
                        message = {"type": "http.response.zerocopysend", "file": file, "offset": offset}
                        await send({**message, "count": length, "more_body": more})
                    self.metrics.bytes_served.inc(length)
                return
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self._stream(send)
                    group.cancel_scope.cancel()

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch_disconnect)
        finally:
            for fd in self.fds:
                os.close(fd)

    async def _stream(self, send: Send) -> None:
        left_total = self.length
        for fd, start, length in self.parts:
            offset, left = start, length
            while left > 0:
                chunk = await anyio.to_thread.run_sync(os.pread, fd, min(CHUNK_BYTES, left), offset)
                if not chunk:
                    raise OSError(f"a stored file ended {left} bytes early")
                offset += len(chunk)
                left -= len(chunk)
                left_total -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": left_total > 0})
                self.metrics.bytes_served.inc(len(chunk))


def create_app(source: ShardSource) -> Starlette:
    """The ASGI app serving ``source``; mount it anywhere (the coordinator mounts it at /shardcast)."""
    metrics = source.metrics

    async def healthz(request: Request) -> Response:
        listing = source.versions_response()
        problems = source.health_problems()
        body: dict[str, object] = {"status": "degraded" if problems else "ok", "role": source.role}
        body["latest"] = listing.latest
        if problems:
            body["problems"] = problems
        return JSONResponse(body)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def versions(request: Request) -> Response:
        return JSONResponse(source.versions_response().model_dump(mode="json"))

    async def manifest(request: Request) -> Response:
        version = parse_index(request.path_params["version"], "version")
        return Response(source.manifest_bytes(version), media_type="application/json")

    async def shard(request: Request) -> Response:
        version = parse_index(request.path_params["version"], "version")
        index = parse_index(request.path_params["index"], "shard index")
        segments, entry = await source.shard_segments(version, index)
        size = sum(segment.length for segment in segments)
        headers = {
            "accept-ranges": "bytes",
            "etag": f'"{entry.hash}"',
            "cache-control": "public, max-age=31536000, immutable",
            "x-shard-hash": entry.hash,
        }
        range_header = request.headers.get("range")
        status = 200
        if range_header is not None:
            try:
                byte_range = parse_range(range_header, size)
            except MalformedRange as exc:
                return error_response(400, "bad_range", str(exc))
            except RangeError as exc:
                return error_response(416, "range_not_satisfiable", str(exc), {"content-range": f"bytes */{size}"})
            segments = slice_segments(segments, byte_range.start, byte_range.length)
            status = 206
            headers["content-range"] = byte_range.content_range(size)
        fds: dict[Path, int] = {}
        try:
            for segment in segments:
                if segment.path not in fds:
                    fds[segment.path] = os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            for fd in fds.values():
                os.close(fd)
            raise NotFoundError(f"version {version} was just removed; ask for a newer one") from exc
        parts = [(fds[segment.path], segment.offset, segment.length) for segment in segments]
        return FileSliceResponse(parts, list(fds.values()), status, headers, request.method != "HEAD", metrics)

    async def prime_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PrimeError)
        headers = {"retry-after": f"{max(1, round(exc.retry_after_s))}"} if isinstance(exc, NotReadyError) else None
        return error_response(exc.status_code, exc.code, exc.message, headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, "http", f"{exc.detail} ({request.method} {request.url.path})")

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/metrics", metrics_route),
            Route("/versions", versions),
            Route("/v/{version}/manifest.json", manifest),
            Route("/v/{version}/shards/{index}", shard, methods=["GET", "HEAD"]),
        ],
        exception_handlers={PrimeError: prime_error, HTTPException: http_error},
    )
    app.add_middleware(RequestMetrics, observe=metrics.observe_request)
    return app


async def serve_http(
    app: Starlette, host: str, port: int, background: Callable[[], Coroutine[Any, Any, None]] | None = None
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM with the zero-copy server, running ``background`` alongside."""
    task = asyncio.create_task(background()) if background is not None else None
    try:
        await serve_asgi(app, host, port)
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def run_event_loop(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on asyncio's own loop: its ``loop.sendfile`` is the zero-copy one (uvloop has none)."""
    asyncio.run(_call(main))


async def _call(main: Callable[[], Awaitable[None]]) -> None:
    await main()
