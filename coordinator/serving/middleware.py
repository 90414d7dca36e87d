"""ASGI middleware in front of every route: body size limit, per-IP rate limit, per-source concurrency.

Plain ASGI (no BaseHTTPMiddleware) so a refusal costs no body read: a declared
``Content-Length`` over the limit is answered 413 before one byte is received, and a chunked
body is cut off with 413 as soon as it passes the limit. The per-IP limit counts every
request from one address, whatever node keys it signs with (one host cannot multiply its
share by minting keys). The per-source concurrency limit lets a few requests of each source
(:mod:`coordinator.ledger.sources`) in at once and queues the rest, so a flood from one source waits
behind itself, not in front of everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.ledger.sources import SourcePolicy
from coordinator.serving.errors import error_response, prime_error_response
from coordinator.serving.ratelimit import RateLimiter
from protocol import routes
from protocol.errors import PayloadTooLargeError, RateLimitedError


class _BodyTooLarge(Exception):  # noqa: N818 - internal signal, never leaves the middleware
    pass


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await error_response(400, "malformed", "Content-Length is not a number")(scope, receive, send)
                return
            if int(declared) > self.max_body_bytes:
                await self._refuse(scope, receive, send, f"declared {int(declared)} bytes")
                return
        received = 0
        started = False
        cut_off = False

        async def limited_receive() -> Message:
            nonlocal received, cut_off
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    cut_off = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if cut_off:  # whatever the app answers to a body we cut off, the answer is 413
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_BodyTooLarge):
            await self.app(scope, limited_receive, guarded_send)
        if cut_off and not started:
            await self._refuse(scope, receive, send, f"more than {self.max_body_bytes} bytes sent")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, what: str) -> None:
        exc = PayloadTooLargeError(f"request body too large: {what}, limit {self.max_body_bytes} bytes")
        response = prime_error_response(exc)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


class IpRateLimit:
    def __init__(self, app: ASGIApp, limiter: RateLimiter, exempt_paths: frozenset[str]) -> None:
        self.app = app
        self.limiter = limiter
        self.exempt_paths = exempt_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.exempt_paths:
            client = scope.get("client")
            address = client[0] if client else "unknown"
            wait_s = self.limiter.retry_after_s(address)
            if wait_s is not None:
                exc = RateLimitedError(f"too many requests from {address}; retry in {wait_s:.1f} s", wait_s)
                await prime_error_response(exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)


SLOT_SCOPE_KEY = "prime.source_slot"
"""Where :class:`SourceConcurrency` leaves the request's :class:`SourceSlot` in the ASGI scope."""


class SourceSlot:
    """The per-source slot a request holds inside the app; a long-poll gives it up while it waits."""

    def __init__(self, owner: SourceConcurrency, source: str) -> None:
        self.owner = owner
        self.source = source
        self.held = True

    @contextlib.asynccontextmanager
    async def released(self) -> AsyncIterator[None]:
        """Let the source's other requests in (and not count this one) for the block; take the slot back after."""
        self.owner._leave(self.source)
        self.held = False
        try:
            yield
        finally:
            await self.owner._enter(self.source)
            self.held = True


class SourceConcurrency:
    """At most ``max_in_flight`` ledger calls (paths under ``/v1/``) of one source inside the app at once; up to
    ``max_waiting`` more wait their turn and further ones are refused with 429. Allow-listed addresses are not
    limited, nor is anything outside ``/v1/`` (policy shards streamed from ``/shardcast``, the dashboard).
    A request's :class:`SourceSlot` is in its scope under :data:`SLOT_SCOPE_KEY`: a long-poll releases it
    while it waits, so waiting neither blocks the source's other calls nor counts against ``max_waiting``."""

    def __init__(self, app: ASGIApp, sources: SourcePolicy, max_in_flight: int, max_waiting: int) -> None:
        self.app = app
        self.sources = sources
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self._slots: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}  # source -> (slots, [requests holding or
        # waiting]); an entry lives while its source has requests, so the table is bounded by open requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        address = client[0] if client else "unknown"
        if scope["type"] != "http" or not scope["path"].startswith(routes.PREFIX) or self.sources.is_allowed(address):
            await self.app(scope, receive, send)
            return
        source = self.sources.prefix(address)
        entry = self._slots.get(source)
        if entry is not None and entry[1][0] >= self.max_in_flight + self.max_waiting:
            exc = RateLimitedError(f"too many concurrent requests from {source}; retry in 1 s", 1.0)
            await prime_error_response(exc)(scope, receive, send)
            return
        await self._enter(source)
        slot = SourceSlot(self, source)
        scope[SLOT_SCOPE_KEY] = slot
        try:
            await self.app(scope, receive, send)
        finally:
            if slot.held:
                self._leave(source)

    async def _enter(self, source: str) -> None:
        """Count a request of ``source`` and wait for one of its slots."""
        slots, users = self._slots.setdefault(source, (asyncio.Semaphore(self.max_in_flight), [0]))
        users[0] += 1
        try:
            await slots.acquire()
        except BaseException:  # cancelled while waiting: it holds nothing
            self._uncount(source)
            raise

    def _leave(self, source: str) -> None:
        """Give a slot of ``source`` back and stop counting its request."""
        self._slots[source][0].release()
        self._uncount(source)

    def _uncount(self, source: str) -> None:
        users = self._slots[source][1]
        users[0] -= 1
        if users[0] == 0:
            del self._slots[source]
