"""The ledger API's routes, one APIRouter per area: nodes, leases, submissions and validation, policy, status.

Routes under ``/v1`` are signed by the caller's node key unless marked public; their bodies
are the wire messages of :mod:`protocol.schemas`. Handlers are thin: authenticate, call one
ledger method (in a worker thread; the ledger blocks on the database), return its message.
The signed routes are ``async`` and hop to a thread once, for the ledger call (FastAPI would
run a sync handler in a thread and hop again to validate its answer), on a few threads of
their own (:class:`LedgerThreads`: more threads only queue for the GIL).
Each builder takes the shared pieces its routes use; :func:`coordinator.serving.app.create_app`
makes those pieces once and includes the routers.
"""

# No `from __future__ import annotations`: FastAPI must see the local `Caller` alias at definition time.

from collections.abc import Callable
from typing import Annotated, TypeVar

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi import Path as FastApiPath
from fastapi.responses import Response

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ledger import Ledger
from coordinator.serving.auth import SignedCaller, SignedRequest
from coordinator.serving.longpoll import PENDING_WAKE_KINDS, LongPolls, lease_wake_kinds
from coordinator.serving.metrics import LedgerMetrics
from coordinator.serving.ratelimit import RegistrationLimit
from protocol import routes
from protocol.errors import ForbiddenError, NotFoundError, RateLimitedError
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE
from protocol.schemas import (
    MAX_LONG_POLL_S,
    MAX_POLICY_VERSION,
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

T = TypeVar("T")

WaitS = Annotated[
    float,
    Query(ge=0, le=MAX_LONG_POLL_S, description="Long-poll: when nothing is there yet, wait up to this long."),
]


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


def node_routes(
    ledger: Ledger, in_thread: LedgerThreads, signed_caller: SignedCaller, registrations: RegistrationLimit
) -> APIRouter:
    """``register`` and ``heartbeat``."""
    router = APIRouter()
    Caller = Annotated[SignedRequest, Depends(signed_caller)]  # noqa: N806 - a type alias, named like one

    @router.post(routes.NODES_REGISTER, tags=["nodes"])
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

    @router.post(routes.NODES_HEARTBEAT, tags=["nodes"])
    async def heartbeat(body: HeartbeatRequest, caller: Caller) -> HeartbeatResponse:
        """Report liveness, engine and policy versions held."""
        return await in_thread(ledger.heartbeat, caller.node_id, body, caller.nonce)

    return router


def lease_routes(
    ledger: Ledger, in_thread: LedgerThreads, signed_caller: SignedCaller, long_polls: LongPolls
) -> APIRouter:
    """``lease`` (long-polled), ``renew`` and ``abandon``."""
    router = APIRouter()
    Caller = Annotated[SignedRequest, Depends(signed_caller)]  # noqa: N806 - a type alias, named like one

    @router.post(routes.LEASES, tags=["leases"])
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

    @router.post(routes.LEASES_RENEW, tags=["leases"])
    async def renew(body: LeaseRenewal, caller: Caller) -> LeaseState:
        """Push an active lease's deadline out by one lease TTL."""
        return await in_thread(ledger.renew, caller.node_id, body.lease_id, caller.nonce)

    @router.post(routes.LEASES_ABANDON, tags=["leases"])
    async def abandon(body: LeaseRenewal, caller: Caller) -> LeaseState:
        """Give a lease back; its task is re-issued at once."""
        return await in_thread(ledger.abandon, caller.node_id, body.lease_id, caller.nonce)

    return router


def submission_routes(
    ledger: Ledger, in_thread: LedgerThreads, signed_caller: SignedCaller, long_polls: LongPolls
) -> APIRouter:
    """``submit``, and for validators ``pending`` (long-polled) and ``verdict``."""
    router = APIRouter()
    Caller = Annotated[SignedRequest, Depends(signed_caller)]  # noqa: N806 - a type alias, named like one

    @router.post(routes.SUBMISSIONS, tags=["submissions"])
    async def submit(
        body: SubmitRequest,
        caller: Caller,
        submission_signature: Annotated[str, Header(alias=HEADER_SUBMISSION_SIGNATURE, max_length=256)],
    ) -> SubmitResponse:
        """Submit a leased task's rollouts; a repeat of the same submission is answered as a duplicate."""
        return await in_thread(ledger.submit, caller.node_id, body, submission_signature, caller.nonce)

    @router.get(routes.SUBMISSIONS_PENDING, tags=["validation"])
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

    @router.post(routes.VERDICTS, tags=["validation"])
    async def verdict(body: Verdict, caller: Caller) -> VerdictResponse:
        """Accept or reject a submission (approved validators only)."""
        return await in_thread(ledger.post_verdict, caller.node_id, body, caller.nonce)

    return router


def policy_routes(
    ledger: Ledger, in_thread: LedgerThreads, signed_caller: SignedCaller, run_spec: SignedRunSpec | None
) -> APIRouter:
    """``publish`` (the coordinator's own key only), the public manifests, and the signed run spec."""
    router = APIRouter()
    Caller = Annotated[SignedRequest, Depends(signed_caller)]  # noqa: N806 - a type alias, named like one

    @router.post(routes.POLICY_VERSIONS, tags=["policy"])
    async def publish(body: SignedManifest, caller: Caller) -> PublishResponse:
        """Publish a policy version under its signed manifest (coordinator-internal: its own key only)."""
        if caller.node_id != ledger.coordinator_id:
            raise ForbiddenError("only the coordinator itself publishes policy versions")
        return await in_thread(ledger.publish, body, caller.nonce)

    @router.get(routes.POLICY_VERSION_LATEST, tags=["policy", "public"])
    def latest_manifest() -> SignedManifest:
        """The newest published policy version's signed manifest."""
        return ledger.manifest(None)

    @router.get(routes.POLICY_VERSION, tags=["policy", "public"])
    def manifest(version: Annotated[int, FastApiPath(ge=0, le=MAX_POLICY_VERSION)]) -> SignedManifest:
        """One published policy version's signed manifest."""
        return ledger.manifest(version)

    @router.get(routes.RUN_SPEC, tags=["public"])
    def signed_spec() -> SignedRunSpec:
        """The run spec the coordinator signed: the environment every role must load to take part."""
        if run_spec is None:
            raise NotFoundError("this ledger serves no run spec")
        return run_spec

    return router


def run_status(config: CoordinatorConfig, ledger: Ledger) -> RunStatus:
    """``GET /v1/status``'s answer: the ledger's status, whether the run ended, and its steps in all."""
    steps = config.orchestrator.num_steps if config.orchestrator.enabled else 0
    return ledger.status().model_copy(update={"run_ended": ledger.run_over(), "num_train_steps": steps})


def status_routes(ledger: Ledger, status_now: Callable[[], RunStatus], metrics: LedgerMetrics) -> APIRouter:
    """The public run status, stats and event log, ``/healthz`` and Prometheus ``/metrics``."""
    router = APIRouter()

    @router.get(routes.STATUS, tags=["public"])
    def status() -> RunStatus:
        """The run at a glance."""
        return status_now()

    @router.get(routes.STATS, tags=["public"])
    def stats(limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> RunStats:
        """Status plus reputation of the most recently seen nodes."""
        return ledger.stats(limit)

    @router.get(routes.EVENTS, tags=["public"])
    def event_log(
        after: Annotated[int, Query(ge=0, lt=2**62)] = 0, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> EventPage:
        """The append-only event log, from after an event id, oldest first."""
        return ledger.events(after, limit)

    @router.get("/healthz", tags=["public"])
    def healthz() -> dict[str, str]:
        """200 when the ledger database answers."""
        ledger.ping()
        return {"status": "ok"}

    @router.get("/metrics", tags=["public"], response_class=Response)
    def prometheus_metrics() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return router
