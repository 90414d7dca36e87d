"""The ledger's FastAPI application: routers, middleware, lifespan, around a :class:`~coordinator.ledger.ledger.Ledger`.

The routes live in :mod:`coordinator.serving.api_routes`, one router per area; :func:`create_app`
makes the pieces they share (the ledger's threads, the signed-caller dependency, long-polls, rate
limits, metrics) and includes them, with the dashboard's.
A background task re-queues expired leases and prunes expired nonces.

The client's address is the TCP peer, or, when the peer is one of ``sources.trusted_proxies``,
the address its ``X-Forwarded-For`` names (uvicorn's ProxyHeadersMiddleware, outermost); the
per-IP limit, registration caps and the sources leases count against all see that address.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from coordinator.config import CoordinatorConfig
from coordinator.ledger.api_processes import ApiProcesses
from coordinator.ledger.audit_policy import audit_summary
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.sources import SourcePolicy
from coordinator.serving.api_routes import (
    LedgerThreads,
    lease_routes,
    node_routes,
    policy_routes,
    run_status,
    status_routes,
    submission_routes,
)
from coordinator.serving.auth import SignedCaller
from coordinator.serving.dashboard import dashboard_router
from coordinator.serving.dashboard.relays import RelayWatch
from coordinator.serving.errors import install_error_handlers
from coordinator.serving.longpoll import LongPolls
from coordinator.serving.metrics import LedgerMetrics
from coordinator.serving.middleware import BodySizeLimit, IpRateLimit, SourceConcurrency
from coordinator.serving.ratelimit import RateLimiter, RegistrationLimit
from protocol.schemas import DashboardAudit, ErrorBody, SignedRunSpec
from runtime.http_metrics import RequestMetrics

__all__ = ["LedgerThreads", "create_app"]

log = logging.getLogger("coordinator.serving")

_ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 429)}
_UNMETERED_PATHS = frozenset({"/healthz", "/metrics"})


def create_app(
    config: CoordinatorConfig,
    ledger: Ledger,
    replay_cache: DatabaseReplayCache,
    relays: RelayWatch | None = None,
    run_spec: SignedRunSpec | None = None,
) -> FastAPI:
    """The API for one ledger; the caller owns the ledger's database (and ``relays``, shown on the dashboard).
    ``run_spec`` is served at ``GET /v1/run-spec`` (404 without one)."""
    api = config.api

    limiters = [
        RateLimiter(api.ip_rate_per_s, api.ip_burst),
        RateLimiter(api.node_rate_per_s, api.node_burst),
        RateLimiter(config.sources.register_rate_per_s, config.sources.register_burst),
        RateLimiter(config.sources.prefix_register_rate_per_s, config.sources.prefix_register_burst),
    ]
    ip_limiter, node_limiter, address_registrations, prefix_registrations = limiters
    # PostgreSQL: API replicas may share the ledger, each enforcing its share of the rate limits.
    processes = None if ledger.db.is_sqlite else ApiProcesses(ledger.db, api.maintenance_interval_s)

    app = FastAPI(
        title="prime-network ledger",
        version="1",
        description="The coordinator's task ledger. Signed routes need the X-Prime-* headers of protocol.signing.",
        lifespan=_lifespan(ledger, replay_cache, api.maintenance_interval_s, processes, limiters),
        responses=_ERRORS,  # type: ignore[arg-type]
    )
    install_error_handlers(app)
    metrics = LedgerMetrics(ledger.status)
    source_policy = SourcePolicy(config.sources)
    _add_middleware(app, config, metrics, source_policy, ip_limiter)
    registrations = RegistrationLimit(source_policy, address_registrations, prefix_registrations)
    in_thread = LedgerThreads(api.num_threads)
    signed_caller = SignedCaller(config.trust.max_clock_skew_s, node_limiter)
    long_polls = LongPolls(ledger.changes, api.max_long_polls_per_node, api.long_poll_recheck_s)
    app.state.long_polls = long_polls  # the service tells it when the server is closing
    status_now = functools.partial(run_status, config, ledger)

    app.include_router(node_routes(ledger, in_thread, signed_caller, registrations))
    app.include_router(lease_routes(ledger, in_thread, signed_caller, long_polls))
    app.include_router(submission_routes(ledger, in_thread, signed_caller, long_polls))
    app.include_router(policy_routes(ledger, in_thread, signed_caller, run_spec))
    app.include_router(status_routes(ledger, status_now, metrics))
    app.include_router(dashboard_router(ledger.views, relays, status_now, _audit(config, run_spec)))
    return app


def _lifespan(
    ledger: Ledger,
    replay_cache: DatabaseReplayCache,
    interval_s: float,
    processes: ApiProcesses | None,
    limiters: list[RateLimiter],
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Join the API processes (PostgreSQL) and run :func:`_maintain` while the app serves; leave at the end."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if processes is not None:
            _share_among(ledger, limiters, await run_in_threadpool(processes.beat))
        task = asyncio.create_task(_maintain(ledger, replay_cache, interval_s, processes, limiters))
        try:
            yield
        finally:
            task.cancel()
            if processes is not None:
                await run_in_threadpool(processes.leave)

    return lifespan


def _add_middleware(
    app: FastAPI,
    config: CoordinatorConfig,
    metrics: LedgerMetrics,
    source_policy: SourcePolicy,
    ip_limiter: RateLimiter,
) -> None:
    """The middleware, innermost first: request metrics, per-source concurrency, per-IP rate limit, body size
    limit, and (with trusted proxies) the proxy headers."""
    api, sources = config.api, config.sources
    app.add_middleware(RequestMetrics, observe=metrics.observe_request)
    app.add_middleware(
        SourceConcurrency,
        sources=source_policy,
        max_in_flight=sources.max_requests_in_flight,
        max_waiting=sources.max_requests_waiting,
    )
    app.add_middleware(IpRateLimit, limiter=ip_limiter, exempt_paths=_UNMETERED_PATHS)
    app.add_middleware(BodySizeLimit, max_body_bytes=api.max_body_bytes)  # before anything reads
    if sources.trusted_proxies:  # outermost: every layer inside sees the client, not the proxy
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=sources.trusted_proxies)


def _audit(config: CoordinatorConfig, run_spec: SignedRunSpec | None) -> DashboardAudit | None:
    """The run's audit policy and its cheating bound, for the dashboard (none without a run spec)."""
    if run_spec is None:
        return None
    scheduling = config.scheduling
    samples = scheduling.prompts_per_task * scheduling.group_size
    return audit_summary(run_spec.spec.audit, run_spec.spec.precision, samples)


def _share_among(ledger: Ledger, limiters: list[RateLimiter], num_processes: int) -> None:
    """This process is one of ``num_processes`` serving the ledger: its share of each rate limit, and whether its
    commits are announced to others."""
    for limiter in limiters:
        limiter.share = 1.0 / num_processes
    if ledger.feed is not None:
        ledger.feed.others = num_processes > 1


async def _maintain(
    ledger: Ledger,
    replay_cache: DatabaseReplayCache,
    interval_s: float,
    processes: ApiProcesses | None,
    limiters: list[RateLimiter],
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            if processes is not None:
                _share_among(ledger, limiters, await run_in_threadpool(processes.beat))
            expired = await run_in_threadpool(ledger.expire_overdue)
            pruned = await run_in_threadpool(replay_cache.prune)
            if expired:
                log.info("re-queued %d expired lease(s); pruned %d nonce(s)", expired, pruned)
        except Exception:  # keep maintaining; the next round retries
            log.exception("ledger maintenance failed")
