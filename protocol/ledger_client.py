"""The client workers and validators use to talk to the ledger API, over an injected httpx client.

Every call is signed with the node's key (:class:`protocol.signing.SignedAuth`); a submission
additionally carries the worker's signature over the submission document (header
``X-Prime-Submission-Signature``), which the ledger stores so a validator can check who made
it without trusting the coordinator. A refusal comes back as the same
:class:`protocol.errors.PrimeError` subclass the ledger raised (mapped from the body's
``error`` code); an unreachable ledger or a 5xx becomes
:class:`~protocol.errors.RemoteUnavailableError`.

Pass ``transport=httpx.ASGITransport(app)`` to drive an in-process app in tests.
"""

from __future__ import annotations

from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from protocol import routes
from protocol.errors import BadSignatureError, PrimeError, RateLimitedError, RemoteUnavailableError, error_for_code
from protocol.identity import NodeIdentity
from protocol.schemas import (
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
    RunSpec,
    RunStats,
    RunStatus,
    SignedManifest,
    SignedRunSpec,
    SubmitRequest,
    SubmitResponse,
    Verdict,
    VerdictResponse,
)
from protocol.signing import SignedAuth, sign_document, verify_document

HEADER_SUBMISSION_SIGNATURE = "X-Prime-Submission-Signature"
ResponseT = TypeVar("ResponseT", bound=BaseModel)


def error_from_response(response: httpx.Response) -> PrimeError:
    """The PrimeError a ledger refusal stands for (RemoteUnavailableError for 5xx and non-JSON answers)."""
    try:
        body = ErrorBody.model_validate_json(response.content)
    except ValidationError:
        return RemoteUnavailableError(f"ledger answered {response.status_code} without an error body")
    if response.status_code >= 500:
        return RemoteUnavailableError(f"ledger failed ({response.status_code} {body.error}): {body.detail}")
    cls = error_for_code(body.error)
    if cls is RateLimitedError:
        return RateLimitedError(body.detail, float(response.headers.get("Retry-After", "1")))
    return cls(body.detail)


class LedgerClient:
    """Async client of one ledger; close it with ``aclose()`` or use ``async with``."""

    def __init__(
        self,
        base_url: str,
        identity: NodeIdentity,
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.identity = identity
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout_s)
        self._auth = SignedAuth(identity)
        self.timeout_s = timeout_s

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        response_type: type[ResponseT],
        body: BaseModel | None = None,
        params: dict[str, int | float] | None = None,
        headers: dict[str, str] | None = None,
        signed: bool = True,
        wait_s: float = 0.0,
    ) -> ResponseT:
        content = body.model_dump_json().encode() if body is not None else None
        request_headers = {"Content-Type": "application/json"} if content is not None else {}
        request_headers.update(headers or {})
        try:
            response = await self._client.request(
                method,
                path,
                content=content,
                params=params,
                headers=request_headers,
                auth=self._auth if signed else None,
                timeout=self.timeout_s + wait_s if wait_s > 0 else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise RemoteUnavailableError(f"ledger unreachable ({type(exc).__name__}: {exc})") from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response_type.model_validate_json(response.content)

    async def register(self, request: RegisterRequest) -> RegisterResponse:
        return await self._call("POST", routes.NODES_REGISTER, RegisterResponse, request)

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return await self._call("POST", routes.NODES_HEARTBEAT, HeartbeatResponse, request)

    async def lease(self, request: LeaseRequest, wait_s: float = 0.0) -> LeaseResponse:
        """Lease tasks; with ``wait_s`` (at most MAX_LONG_POLL_S) a long-poll: the ledger holds an empty answer until
        a task can be leased or ``wait_s`` has passed (then ``retry_after_s`` is 0: ask again at once). A ledger
        that does not long-poll answers at once, with its usual retry delay."""
        params: dict[str, int | float] | None = {"wait_s": wait_s} if wait_s > 0 else None
        return await self._call("POST", routes.LEASES, LeaseResponse, request, params=params, wait_s=wait_s)

    async def renew(self, lease_id: str) -> LeaseState:
        return await self._call("POST", routes.LEASES_RENEW, LeaseState, LeaseRenewal(lease_id=lease_id))

    async def abandon(self, lease_id: str) -> LeaseState:
        return await self._call("POST", routes.LEASES_ABANDON, LeaseState, LeaseRenewal(lease_id=lease_id))

    async def submit(self, request: SubmitRequest) -> SubmitResponse:
        signature = sign_document(self.identity, request.model_dump(mode="json"))
        headers = {HEADER_SUBMISSION_SIGNATURE: signature}
        return await self._call("POST", routes.SUBMISSIONS, SubmitResponse, request, headers=headers)

    async def pending(self, limit: int = 16, wait_s: float = 0.0) -> PendingSubmissions:
        """Submissions to audit; with ``wait_s`` a long-poll that holds an empty answer until one is submitted."""
        params: dict[str, int | float] = {"limit": limit} | ({"wait_s": wait_s} if wait_s > 0 else {})
        return await self._call("GET", routes.SUBMISSIONS_PENDING, PendingSubmissions, params=params, wait_s=wait_s)

    async def post_verdict(self, verdict: Verdict) -> VerdictResponse:
        return await self._call("POST", routes.VERDICTS, VerdictResponse, verdict)

    async def publish(self, signed: SignedManifest) -> PublishResponse:
        return await self._call("POST", routes.POLICY_VERSIONS, PublishResponse, signed)

    async def manifest(self, version: int | None = None) -> SignedManifest:
        path = routes.POLICY_VERSION_LATEST if version is None else routes.fill(routes.POLICY_VERSION, version=version)
        return await self._call("GET", path, SignedManifest, signed=False)

    async def run_spec(self, coordinator_id: str) -> RunSpec:
        """The run spec, verified as signed by ``coordinator_id`` (BadSignatureError otherwise)."""
        signed = await self._call("GET", routes.RUN_SPEC, SignedRunSpec, signed=False)
        if signed.signer != coordinator_id:
            raise BadSignatureError(f"the run spec is signed by {signed.signer}, not the coordinator {coordinator_id}")
        verify_document(coordinator_id, signed.spec.model_dump(mode="json"), signed.signature_b64)
        return signed.spec

    async def status(self) -> RunStatus:
        return await self._call("GET", routes.STATUS, RunStatus, signed=False)

    async def stats(self, limit: int = 100) -> RunStats:
        return await self._call("GET", routes.STATS, RunStats, params={"limit": limit}, signed=False)

    async def events(self, after: int = 0, limit: int = 100) -> EventPage:
        return await self._call("GET", routes.EVENTS, EventPage, params={"after": after, "limit": limit}, signed=False)
