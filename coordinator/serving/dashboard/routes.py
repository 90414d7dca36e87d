"""The dashboard's routes: the page at ``/dashboard`` (``/`` leads there), its static files, ``GET /v1/dashboard``.

The page is plain HTML, CSS and JavaScript shipped inside this package (no CDN, no build step);
it polls ``/v1/dashboard`` every two seconds and draws its charts as inline SVG. The static
files are read once at start-up and served from a fixed list of names, so no request path ever
reaches the file system. The page's Content-Security-Policy allows only this origin, which
also keeps any text that came from a node from running as script.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at definition time.

from collections.abc import Callable
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from coordinator.ledger.views import LedgerViews
from coordinator.serving.dashboard.relays import RelayWatch
from coordinator.serving.dashboard.source import DashboardSource
from protocol import routes
from protocol.errors import NotFoundError
from protocol.schemas import Dashboard, DashboardAudit, RunStatus

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}


def _static(name: str) -> bytes:
    return (resources.files("coordinator.serving.dashboard") / "static" / name).read_bytes()


def dashboard_router(
    views: LedgerViews,
    relays: RelayWatch | None = None,
    status: Callable[[], RunStatus] | None = None,
    audit: DashboardAudit | None = None,
) -> APIRouter:
    """The dashboard for one ledger (include it in the ledger's app); ``relays``: those heard on gossip;
    ``status``: the run's status as ``GET /v1/status`` gives it (with the run's steps in all, for the ETA);
    ``audit``: the run's audit policy and its cheating bound."""
    source = DashboardSource(views, relays, status, audit)
    page = _static("index.html")
    assets = {name: _static(name) for name in _ASSETS}
    headers = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    router = APIRouter()

    @router.get(routes.DASHBOARD, tags=["public"])
    async def dashboard_data() -> Dashboard:
        """Live workers, recent verdicts, policy versions and their relays, training steps, and the charts' series."""
        return await run_in_threadpool(source.snapshot)

    @router.get("/", include_in_schema=False)
    def landing() -> Response:
        """A person who opens the coordinator's address lands on the dashboard (machines use /v1/...)."""
        return Response(status_code=307, headers={"Location": "/dashboard"})

    @router.get("/dashboard", include_in_schema=False)
    def dashboard_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    @router.get("/dashboard/{name}", include_in_schema=False)
    def dashboard_asset(name: str) -> Response:
        if name not in assets:
            raise NotFoundError(f"no dashboard file {name!r}; the page is at /dashboard")
        return Response(assets[name], media_type=_ASSETS[name], headers=headers)

    return router
