"""Who is calling: the signed-request check as a FastAPI dependency, plus the per-node rate limit.

The signature covers the method, the path with its query exactly as sent, the body's SHA-256,
a timestamp and a nonce (see :mod:`protocol.signing`). The body is read once here (Starlette
caches it for the route's own parsing), the check runs in a worker thread because the nonce
goes to the database, and the per-node limit applies only after the signature verified, so
nobody can spend another node's allowance.
"""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from coordinator.ratelimit import RateLimiter
from protocol.errors import RateLimitedError
from protocol.signing import ReplayCache, verify_request


def signed_path(request: Request) -> str:
    """The path and query as the client sent them (what the client signed)."""
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    query = request.scope.get("query_string", b"")
    return raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")


class SignedCaller:
    """Dependency that returns the verified node id of the caller or raises a SignatureError (401)."""

    def __init__(self, replay_cache: ReplayCache, max_skew_s: float, limiter: RateLimiter) -> None:
        self.replay_cache = replay_cache
        self.max_skew_s = max_skew_s
        self.limiter = limiter

    async def __call__(self, request: Request) -> str:
        body = await request.body()
        verified = await run_in_threadpool(
            verify_request,
            request.method,
            signed_path(request),
            body,
            request.headers,
            self.replay_cache,
            self.max_skew_s,
        )
        wait_s = self.limiter.retry_after_s(verified.node_id)
        if wait_s is not None:
            raise RateLimitedError(f"node {verified.node_id} is over its request rate; retry in {wait_s:.1f} s", wait_s)
        return verified.node_id
