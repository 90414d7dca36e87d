"""Who is calling: the signed-request check as a FastAPI dependency, plus the per-node rate limit.

The signature covers the method, the path with its query exactly as sent, the body's SHA-256,
a timestamp and a nonce (see :mod:`protocol.signing`). The body is read once here (Starlette
caches it for the route's own parsing). The nonce is not stored here: it travels with the
caller to the ledger, which stores it in the request's own transaction and refuses a replay
there (:mod:`coordinator.ledger.replay`). The per-node limit applies only after the signature
verified, so nobody can spend another node's allowance.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from coordinator.ledger.replay import DeferredNonce, NonceClaim
from coordinator.serving.ratelimit import RateLimiter
from protocol.errors import RateLimitedError
from protocol.signing import verify_request


@dataclass(frozen=True)
class SignedRequest:
    node_id: str
    """The verified signer."""
    nonce: NonceClaim
    """For the ledger to store with the request's effect (a second use is a replay)."""


def signed_path(request: Request) -> str:
    """The path and query as the client sent them (what the client signed)."""
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    query = request.scope.get("query_string", b"")
    return raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")


class SignedCaller:
    """Dependency that returns the verified caller or raises a SignatureError (401)."""

    def __init__(self, max_skew_s: float, limiter: RateLimiter) -> None:
        self.max_skew_s = max_skew_s
        self.limiter = limiter

    async def __call__(self, request: Request) -> SignedRequest:
        body = await request.body()
        deferred = DeferredNonce()
        # Ed25519 verification takes ~0.1 ms: cheaper inline than a hop to a worker thread.
        verified = verify_request(
            request.method, signed_path(request), body, request.headers, deferred, self.max_skew_s
        )
        assert deferred.claim is not None
        wait_s = self.limiter.retry_after_s(verified.node_id)
        if wait_s is not None:
            raise RateLimitedError(f"node {verified.node_id} is over its request rate; retry in {wait_s:.1f} s", wait_s)
        return SignedRequest(verified.node_id, deferred.claim)
