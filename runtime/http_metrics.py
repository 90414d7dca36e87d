"""ASGI middleware that reports every HTTP request to a metrics callback: the ledger's and SHARDCAST's servers share it.

Plain ASGI (no BaseHTTPMiddleware), so a streamed body is never buffered to be measured. The
middleware knows no metric names: each server passes a callback that picks its own labels from
the request's scope (the ledger its route templates, SHARDCAST its route kinds) and records
them in its own registry, so one process may run several servers side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Observe = Callable[[Scope, int | None, float], None]
"""Called once per HTTP request when the app is done with it, returning or raising, with the status code
it sent (None when it sent none: it raised first, and the server around it answers) and the seconds
since the request came in."""


class RequestMetrics:
    """Times each HTTP request through ``app`` and hands it to ``observe``; other scopes pass untouched."""

    def __init__(self, app: ASGIApp, observe: Observe) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.observe(scope, status, time.perf_counter() - started)


def route_template(scope: Scope) -> str:
    """The template of the route that served the request (``/v1/policy-versions/{version}``), or ``unmatched``.

    A template, not the raw path, so a metric's label values stay bounded whatever paths clients send.
    """
    route: Any = scope.get("route")  # set by the router while the app handles the request
    return getattr(route, "path", None) or "unmatched"
