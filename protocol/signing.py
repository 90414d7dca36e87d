"""Signed HTTP requests and signed documents.

A request is signed over one canonical byte string::

    prime-network/request/v1 \\n METHOD \\n PATH?QUERY \\n sha256(body) hex \\n timestamp \\n nonce \\n node id

and carries four headers (``X-Prime-Node``, ``X-Prime-Timestamp``, ``X-Prime-Nonce``,
``X-Prime-Signature``). The verifier recomputes the string from what it received, so a change
to the method, path, query, body, timestamp or nonce breaks the signature. It then refuses a
timestamp outside the clock-skew window and a nonce the node has used before; the nonce store
is the :class:`ReplayCache` interface (in memory here, the ledger's database in production).
A nonce only needs remembering for the skew window: older timestamps are refused anyway.

Documents (manifests, verdicts, gossip announcements) are signed over their canonical JSON.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from protocol.errors import (
    BadSignatureError,
    IdentityError,
    MissingSignatureError,
    ReplayedNonceError,
    StaleTimestampError,
)
from protocol.identity import NodeIdentity, verify_signature

REQUEST_DOMAIN = b"prime-network/request/v1"
DOCUMENT_DOMAIN = b"prime-network/document/v1"
HEADER_NODE = "X-Prime-Node"
HEADER_TIMESTAMP = "X-Prime-Timestamp"
HEADER_NONCE = "X-Prime-Nonce"
HEADER_SIGNATURE = "X-Prime-Signature"
DEFAULT_MAX_SKEW_S = 60.0
_NONCE_BYTES = 16


def canonical_json(value: Any) -> bytes:
    """The one byte encoding of a JSON value that signatures cover (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def request_message(method: str, path: str, body: bytes, timestamp: str, nonce: str, node_id: str) -> bytes:
    body_hash = hashlib.sha256(body).hexdigest()
    parts = [REQUEST_DOMAIN, method.upper().encode(), path.encode(), body_hash.encode()]
    parts += [timestamp.encode(), nonce.encode(), node_id.encode()]
    return b"\n".join(parts)


def sign_request(
    identity: NodeIdentity, method: str, path: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """The headers that sign one request; ``path`` includes the query string, if any."""
    timestamp = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(_NONCE_BYTES)
    signature = identity.sign(request_message(method, path, body, timestamp, nonce, identity.node_id))
    return {
        HEADER_NODE: identity.node_id,
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: base64.b64encode(signature).decode(),
    }


class ReplayCache(Protocol):
    """Remembers (node id, nonce) pairs until they expire."""

    def remember(self, node_id: str, nonce: str, expires_at: float) -> bool:
        """Store the pair; False when it was already stored and has not expired (a replay)."""
        ...


class MemoryReplayCache:
    """A ReplayCache for one process; forgets entries after their expiry."""

    def __init__(self) -> None:
        self._expiry: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._next_prune = 0.0

    def remember(self, node_id: str, nonce: str, expires_at: float) -> bool:
        now = time.time()
        with self._lock:
            if now >= self._next_prune:
                self._expiry = {key: exp for key, exp in self._expiry.items() if exp > now}
                self._next_prune = now + 10.0
            key = (node_id, nonce)
            if self._expiry.get(key, 0.0) > now:
                return False
            self._expiry[key] = expires_at
            return True


@dataclass(frozen=True)
class VerifiedRequest:
    node_id: str
    timestamp: float
    nonce: str


def verify_request(
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    replay_cache: ReplayCache,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
    now: float | None = None,
) -> VerifiedRequest:
    """Check a signed request; return who sent it or raise a SignatureError saying why not.

    ``headers`` must look names up case-insensitively (Starlette's and httpx's headers do).
    """
    names = (HEADER_NODE, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
    node_id, timestamp_text, nonce, signature_text = (headers.get(name) for name in names)
    if node_id is None or timestamp_text is None or nonce is None or signature_text is None:
        missing = [name for name in names if headers.get(name) is None]
        raise MissingSignatureError(f"request is not signed: missing header(s) {', '.join(missing)}")
    try:
        timestamp = float(timestamp_text)
        signature = base64.b64decode(signature_text, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise MissingSignatureError(f"malformed signature headers: {exc}") from exc
    if not 16 <= len(nonce) <= 128:
        raise MissingSignatureError("nonce must be 16 to 128 characters")
    try:
        verify_signature(node_id, request_message(method, path, body, timestamp_text, nonce, node_id), signature)
    except IdentityError as exc:
        raise BadSignatureError(f"{HEADER_NODE} is not a valid node id: {exc.message}") from exc
    current = time.time() if now is None else now
    if abs(current - timestamp) > max_skew_s:
        # signed from the node's side: a node whose clock is behind the server's is told a negative offset
        offset = timestamp - current
        raise StaleTimestampError(
            f"the node's clock is {abs(offset):.1f} s {'behind' if offset < 0 else 'ahead of'} the server's "
            f"(offset {offset:+.1f} s, allowed: ±{max_skew_s:.0f} s); check the node's clock (NTP)"
        )
    if not replay_cache.remember(node_id, nonce, timestamp + max_skew_s):
        raise ReplayedNonceError(f"nonce {nonce} was already used by node {node_id}; requests cannot be replayed")
    return VerifiedRequest(node_id=node_id, timestamp=timestamp, nonce=nonce)


class SignedAuth(httpx.Auth):
    """httpx auth that signs every request with a node's key."""

    requires_request_body = True

    def __init__(self, identity: NodeIdentity) -> None:
        self.identity = identity

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        path = request.url.raw_path.decode()
        request.headers.update(sign_request(self.identity, request.method, path, request.content))
        yield request


def sign_document(identity: NodeIdentity, document: Mapping[str, Any]) -> str:
    """A base64 signature over a JSON document's canonical form."""
    return base64.b64encode(identity.sign(DOCUMENT_DOMAIN + b"\n" + canonical_json(document))).decode()


def verify_document(node_id: str, document: Mapping[str, Any], signature: str) -> None:
    """Raise BadSignatureError unless ``signature`` is ``node_id``'s over ``document``."""
    verify_canonical_document(node_id, canonical_json(document), signature)


def verify_canonical_document(node_id: str, canonical: bytes, signature: str) -> None:
    """:func:`verify_document` for a document already in its :func:`canonical_json` form (no second encoding)."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise BadSignatureError(f"signature is not base64: {exc}") from exc
    try:
        verify_signature(node_id, DOCUMENT_DOMAIN + b"\n" + canonical, raw)
    except IdentityError as exc:
        raise BadSignatureError(f"signer is not a valid node id: {exc.message}") from exc
