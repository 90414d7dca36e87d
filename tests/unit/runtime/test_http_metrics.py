"""The shared request-metrics middleware: one report per HTTP request, answered, failed or streamed."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from runtime.http_metrics import RequestMetrics, route_template

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_each_request_is_reported_once_with_its_status_and_route_template() -> None:
    seen: list[tuple[str, int | None]] = []

    async def item(request: Request) -> Response:
        return PlainTextResponse("x", status_code=201)

    async def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    app = Starlette(routes=[Route("/items/{name}", item), Route("/broken", broken)])
    app.add_middleware(RequestMetrics, observe=lambda scope, status, _s: seen.append((route_template(scope), status)))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/items/a")).status_code == 201
        assert (await client.get("/nowhere")).status_code == 404
        assert (await client.get("/broken")).status_code == 500
    # The failed request sent nothing itself: its 500 comes from the server around the middleware.
    assert seen == [("/items/{name}", 201), ("unmatched", 404), ("/broken", None)]
