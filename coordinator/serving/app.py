"""The ledger's FastAPI application: routes, wired to a :class:`~coordinator.ledger.ledger.Ledger`.

Routes under ``/v1`` are signed by the caller's node key unless marked public; their bodies
are the wire messages of :mod:`protocol.schemas`. Handlers are thin: authenticate, call one
ledger method (in a worker thread; the ledger blocks on the database), return its message.
The signed routes are ``async`` and hop to a thread once, for the ledger call (FastAPI would
run a sync handler in a thread and hop again to validate its answer), on a few threads of
their own (:class:`LedgerThreads`: more threads only queue for the GIL).
A background task re-queues expired leases and prunes expired nonces.

The client's address is the TCP peer, or, when the peer is one of ``sources.trusted_proxies``,
the address its ``X-Forwarded-For`` names (uvicorn's ProxyHeadersMiddleware, outermost); the
per-IP limit, registration caps and the sources leases count against all see that address.
"""

# No `from __future__ import annotations`: FastAPI must see the local `Caller` alias at definition time.

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as FastApiPath
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from coordinator.config import CoordinatorConfig
from coordinator.ledger.api_processes import ApiProcesses
from coordinator.ledger.audit_policy import audit_summary
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.sources import SourcePolicy
from coordinator.serving.auth import SignedCaller, SignedRequest
from coordinator.serving.dashboard import dashboard_router
from coordinator.serving.dashboard.relays import RelayWatch
from coordinator.serving.errors import install_error_handlers
from coordinator.serving.longpoll import PENDING_WAKE_KINDS, LongPolls, lease_wake_kinds
from coordinator.serving.metrics import LedgerMetrics
from coordinator.serving.middleware import BodySizeLimit, IpRateLimit, SourceConcurrency
from coordinator.serving.ratelimit import RateLimiter, RegistrationLimit
from protocol import routes
from protocol.errors import ForbiddenError, NotFoundError, RateLimitedError
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE
from protocol.schemas import (
    MAX_LONG_POLL_S,
    MAX_POLICY_VERSION,
    ErrorBody,
    EventPage,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRenewal,
    LeaseRequest,
    LeaseResponse,
    LeaseState,
    PendingSubmissions,
    PublishResponse,
    RegisterRequest,
    RegisterResponse,
    RunStats,
    RunStatus,
    SignedManifest,
    SignedRunSpec,
    SubmitRequest,
    SubmitResponse,
    Verdict,
    VerdictResponse,
)
from runtime.http_metrics import RequestMetrics

log = logging.getLogger("coordinator.serving")

T = TypeVar("T")


class LedgerThreads:
    """Runs ledger calls in worker threads, at most ``num_threads`` at once (see ApiConfig.num_threads).

    Its own limiter, so shard streaming and FastAPI's sync routes keep anyio's default threads.
    """

    def __init__(self, num_threads: int) -> None:
        self.num_threads = num_threads
        self._limiter: anyio.CapacityLimiter | None = None  # made inside the event loop, on first use

    async def __call__(self, call: Callable[..., T], *args: object) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.num_threads)
        return await anyio.to_thread.run_sync(call, *args, limiter=self._limiter)


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

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if processes is not None:
            _share_among(ledger, limiters, await run_in_threadpool(processes.beat))
        task = asyncio.create_task(_maintain(ledger, replay_cache, api.maintenance_interval_s, processes, limiters))
        try:
            yield
        finally:
            task.cancel()
            if processes is not None:
                await run_in_threadpool(processes.leave)

    app = FastAPI(
        title="prime-network ledger",
        version="1",
        description="The coordinator's task ledger. Signed routes need the X-Prime-* headers of protocol.signing.",
        lifespan=lifespan,
        responses=_ERRORS,  # type: ignore[arg-type]
    )
    install_error_handlers(app)
    metrics = LedgerMetrics(ledger.status)
    app.add_middleware(RequestMetrics, observe=metrics.observe_request)
    sources = config.sources
    source_policy = SourcePolicy(sources)
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
    registrations = RegistrationLimit(source_policy, address_registrations, prefix_registrations)
    in_thread = LedgerThreads(api.num_threads)
    caller = SignedCaller(config.trust.max_clock_skew_s, node_limiter)
    Caller = Annotated[SignedRequest, Depends(caller)]  # noqa: N806 - a type alias, named like one

    @app.post(routes.NODES_REGISTER, tags=["nodes"])
    async def register(body: RegisterRequest, caller: Caller, request: Request) -> RegisterResponse:
        """Register (or update) the calling node: workers are permissionless, validators need approval."""
        ip = request.client.host if request.client else "unknown"
        wait_s = registrations.retry_after_s(ip)
        if wait_s is not None:
            raise RateLimitedError(
                f"too many registrations from {ip} or its network; retry in {wait_s:.1f} s "
                "(an operator can allow-list trusted networks in sources.allow)",
                wait_s,
            )
        return await in_thread(ledger.register, caller.node_id, ip, body, caller.nonce)

    @app.post(routes.NODES_HEARTBEAT, tags=["nodes"])
    async def heartbeat(body: HeartbeatRequest, caller: Caller) -> HeartbeatResponse:
        """Report liveness, engine and policy versions held."""
        return await in_thread(ledger.heartbeat, caller.node_id, body, caller.nonce)

    long_polls = LongPolls(ledger.changes, api.max_long_polls_per_node, api.long_poll_recheck_s)
    app.state.long_polls = long_polls  # the service tells it when the server is closing
    WaitS = Annotated[  # noqa: N806 - a type alias, named like one
        float,
        Query(ge=0, le=MAX_LONG_POLL_S, description="Long-poll: when nothing is there yet, wait up to this long."),
    ]

    @app.post(routes.LEASES, tags=["leases"])
    async def lease(body: LeaseRequest, caller: Caller, request: Request, wait_s: WaitS = 0.0) -> LeaseResponse:
        """Lease up to max_tasks tasks (fewer, or none with a retry delay, when caps or fair share bind); with
        wait_s, an empty answer waits until tasks can be leased (see coordinator/serving/longpoll.py)."""

        async def attempt(first: bool) -> LeaseResponse:
            if ledger.run_over():
                raise ledger.refuse_after_end(caller.node_id)
            return await in_thread(ledger.lease, caller.node_id, body, caller.nonce if first else None)

        leased, waited_out = await long_polls.answer(
            request, caller.node_id, wait_s, lease_wake_kinds(caller.node_id), attempt, lambda r: bool(r.tasks)
        )
        return leased.model_copy(update={"retry_after_s": 0.0}) if waited_out else leased

    @app.post(routes.LEASES_RENEW, tags=["leases"])
    async def renew(body: LeaseRenewal, caller: Caller) -> LeaseState:
        """Push an active lease's deadline out by one lease TTL."""
        return await in_thread(ledger.renew, caller.node_id, body.lease_id, caller.nonce)

    @app.post(routes.LEASES_ABANDON, tags=["leases"])
    async def abandon(body: LeaseRenewal, caller: Caller) -> LeaseState:
        """Give a lease back; its task is re-issued at once."""
        return await in_thread(ledger.abandon, caller.node_id, body.lease_id, caller.nonce)

    @app.post(routes.SUBMISSIONS, tags=["submissions"])
    async def submit(
        body: SubmitRequest,
        caller: Caller,
        submission_signature: Annotated[str, Header(alias=HEADER_SUBMISSION_SIGNATURE, max_length=256)],
    ) -> SubmitResponse:
        """Submit a leased task's rollouts; a repeat of the same submission is answered as a duplicate."""
        return await in_thread(ledger.submit, caller.node_id, body, submission_signature, caller.nonce)

    @app.get(routes.SUBMISSIONS_PENDING, tags=["validation"])
    async def pending(
        caller: Caller, request: Request, limit: Annotated[int, Query(ge=1, le=256)] = 16, wait_s: WaitS = 0.0
    ) -> PendingSubmissions:
        """Submissions awaiting a verdict, oldest first (approved validators only); with wait_s, an empty answer
        waits until one is submitted."""

        async def attempt(first: bool) -> PendingSubmissions:
            over = ledger.run_over()  # read first: a submission made before the end is still handed out below
            found = await in_thread(ledger.pending, caller.node_id, limit, caller.nonce if first else None)
            if over and not found.submissions:  # the validator has audited everything there is
                raise ledger.refuse_after_end(caller.node_id)
            return found

        found, _waited_out = await long_polls.answer(
            request, caller.node_id, wait_s, PENDING_WAKE_KINDS, attempt, lambda r: bool(r.submissions)
        )
        return found

    @app.post(routes.VERDICTS, tags=["validation"])
    async def verdict(body: Verdict, caller: Caller) -> VerdictResponse:
        """Accept or reject a submission (approved validators only)."""
        return await in_thread(ledger.post_verdict, caller.node_id, body, caller.nonce)

    @app.post(routes.POLICY_VERSIONS, tags=["policy"])
    async def publish(body: SignedManifest, caller: Caller) -> PublishResponse:
        """Publish a policy version under its signed manifest (coordinator-internal: its own key only)."""
        if caller.node_id != ledger.coordinator_id:
            raise ForbiddenError("only the coordinator itself publishes policy versions")
        return await in_thread(ledger.publish, body, caller.nonce)

    @app.get(routes.POLICY_VERSION_LATEST, tags=["policy", "public"])
    def latest_manifest() -> SignedManifest:
        """The newest published policy version's signed manifest."""
        return ledger.manifest(None)

    @app.get(routes.POLICY_VERSION, tags=["policy", "public"])
    def manifest(version: Annotated[int, FastApiPath(ge=0, le=MAX_POLICY_VERSION)]) -> SignedManifest:
        """One published policy version's signed manifest."""
        return ledger.manifest(version)

    @app.get(routes.RUN_SPEC, tags=["public"])
    def signed_spec() -> SignedRunSpec:
        """The run spec the coordinator signed: the environment every role must load to take part."""
        if run_spec is None:
            raise NotFoundError("this ledger serves no run spec")
        return run_spec

    def run_status() -> RunStatus:
        steps = config.orchestrator.num_steps if config.orchestrator.enabled else 0
        return ledger.status().model_copy(update={"run_ended": ledger.run_over(), "num_train_steps": steps})

    @app.get(routes.STATUS, tags=["public"])
    def status() -> RunStatus:
        """The run at a glance."""
        return run_status()

    @app.get(routes.STATS, tags=["public"])
    def stats(limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> RunStats:
        """Status plus reputation of the most recently seen nodes."""
        return ledger.stats(limit)

    @app.get(routes.EVENTS, tags=["public"])
    def event_log(
        after: Annotated[int, Query(ge=0, lt=2**62)] = 0, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> EventPage:
        """The append-only event log, from after an event id, oldest first."""
        return ledger.events(after, limit)

    @app.get("/healthz", tags=["public"])
    def healthz() -> dict[str, str]:
        """200 when the ledger database answers."""
        ledger.ping()
        return {"status": "ok"}

    @app.get("/metrics", tags=["public"], response_class=Response)
    def prometheus_metrics() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    audit = None
    if run_spec is not None:
        scheduling = config.scheduling
        samples = scheduling.prompts_per_task * scheduling.group_size
        audit = audit_summary(run_spec.spec.audit, run_spec.spec.precision, samples)
    app.include_router(dashboard_router(ledger, relays, run_status, audit))
    return app


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
