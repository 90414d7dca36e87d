"""Signed requests and documents: round trip, and every kind of tampering refused."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from protocol.errors import (
    BadSignatureError,
    MissingSignatureError,
    ReplayedNonceError,
    SignatureError,
    StaleTimestampError,
)
from protocol.identity import NodeIdentity
from protocol.signing import (
    HEADER_NODE,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    MemoryReplayCache,
    SignedAuth,
    canonical_json,
    sign_document,
    sign_request,
    verify_document,
    verify_request,
)

BODY = b'{"v":1,"max_tasks":2}'
PATH = "/v1/leases?wait=1"


@pytest.fixture
def identity() -> NodeIdentity:
    return NodeIdentity.generate()


def test_round_trip(identity: NodeIdentity) -> None:
    headers = sign_request(identity, "POST", PATH, BODY)
    verified = verify_request("POST", PATH, BODY, headers, MemoryReplayCache())
    assert verified.node_id == identity.node_id
    assert verified.nonce == headers[HEADER_NONCE]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", PATH, BODY),  # method changed
        ("POST", "/v1/leases?wait=2", BODY),  # query changed
        ("POST", "/v1/submissions", BODY),  # path changed
        ("POST", PATH, BODY + b" "),  # body changed
        ("POST", PATH, b""),  # body dropped
    ],
)
def test_changed_request_is_refused(identity: NodeIdentity, method: str, path: str, body: bytes) -> None:
    headers = sign_request(identity, "POST", PATH, BODY)
    with pytest.raises(BadSignatureError):
        verify_request(method, path, body, headers, MemoryReplayCache())


@pytest.mark.parametrize("header", [HEADER_TIMESTAMP, HEADER_NONCE])
def test_changed_timestamp_or_nonce_is_refused(identity: NodeIdentity, header: str) -> None:
    headers = sign_request(identity, "POST", PATH, BODY)
    original = headers[header]
    headers[header] = f"{float(original) + 1:.3f}" if header == HEADER_TIMESTAMP else "f" * len(original)
    with pytest.raises(BadSignatureError):
        verify_request("POST", PATH, BODY, headers, MemoryReplayCache())


def test_other_node_claiming_the_signature_is_refused(identity: NodeIdentity) -> None:
    headers = sign_request(identity, "POST", PATH, BODY)
    headers[HEADER_NODE] = NodeIdentity.generate().node_id
    with pytest.raises(BadSignatureError):
        verify_request("POST", PATH, BODY, headers, MemoryReplayCache())


def test_replayed_nonce_is_refused(identity: NodeIdentity) -> None:
    cache = MemoryReplayCache()
    headers = sign_request(identity, "POST", PATH, BODY)
    verify_request("POST", PATH, BODY, headers, cache)
    with pytest.raises(ReplayedNonceError):
        verify_request("POST", PATH, BODY, headers, cache)


def test_same_nonce_from_another_node_is_not_a_replay(identity: NodeIdentity) -> None:
    cache = MemoryReplayCache()
    assert cache.remember(identity.node_id, "n" * 32, time.time() + 60)
    assert cache.remember(NodeIdentity.generate().node_id, "n" * 32, time.time() + 60)
    assert not cache.remember(identity.node_id, "n" * 32, time.time() + 60)


@pytest.mark.parametrize("offset_s", [-120.0, 120.0])
def test_stale_or_future_timestamp_is_refused(identity: NodeIdentity, offset_s: float) -> None:
    headers = sign_request(identity, "POST", PATH, BODY, now=time.time() + offset_s)
    with pytest.raises(StaleTimestampError, match="clock"):
        verify_request("POST", PATH, BODY, headers, MemoryReplayCache(), max_skew_s=60)


@pytest.mark.parametrize(("offset_s", "words"), [(-120.0, r"120\.0 s behind .*offset -120\.0 s"), (120.0, r"ahead")])
def test_skew_message_is_signed_from_the_node_side(identity: NodeIdentity, offset_s: float, words: str) -> None:
    now = 1_700_000_000.0
    headers = sign_request(identity, "POST", PATH, BODY, now=now + offset_s)
    with pytest.raises(StaleTimestampError, match=words):
        verify_request("POST", PATH, BODY, headers, MemoryReplayCache(), max_skew_s=60, now=now)


def test_timestamp_within_skew_is_accepted(identity: NodeIdentity) -> None:
    headers = sign_request(identity, "POST", PATH, BODY, now=time.time() - 30)
    verify_request("POST", PATH, BODY, headers, MemoryReplayCache(), max_skew_s=60)


@pytest.mark.parametrize("missing", [HEADER_NODE, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE])
def test_missing_header_is_refused_with_its_name(identity: NodeIdentity, missing: str) -> None:
    headers = sign_request(identity, "POST", PATH, BODY)
    del headers[missing]
    with pytest.raises(MissingSignatureError, match=missing):
        verify_request("POST", PATH, BODY, headers, MemoryReplayCache())


@pytest.mark.parametrize(
    ("header", "value"),
    [(HEADER_SIGNATURE, "***"), (HEADER_TIMESTAMP, "yesterday"), (HEADER_NODE, "not-a-node-id")],
)
def test_malformed_headers_are_signature_errors(identity: NodeIdentity, header: str, value: str) -> None:
    headers = sign_request(identity, "POST", PATH, BODY)
    headers[header] = value
    with pytest.raises(SignatureError):
        verify_request("POST", PATH, BODY, headers, MemoryReplayCache())


def test_httpx_auth_signs_what_is_sent(identity: NodeIdentity) -> None:
    cache = MemoryReplayCache()
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        verified = verify_request(
            request.method, request.url.raw_path.decode(), request.content, request.headers, cache
        )
        seen.append(verified.node_id)
        return httpx.Response(200)

    with httpx.Client(transport=httpx.MockTransport(handler), auth=SignedAuth(identity)) as client:
        client.post("http://ledger/v1/leases", params={"wait": 1}, json={"max_tasks": 2})
        client.get("http://ledger/v1/status")
    assert seen == [identity.node_id, identity.node_id]


def test_document_signature(identity: NodeIdentity) -> None:
    document = {"version": 3, "shards": [{"hash": "ab", "size": 10}], "note": "é"}
    signature = sign_document(identity, document)
    verify_document(identity.node_id, json.loads(json.dumps(document)), signature)
    with pytest.raises(BadSignatureError):
        verify_document(identity.node_id, {**document, "version": 4}, signature)
    with pytest.raises(BadSignatureError):
        verify_document(NodeIdentity.generate().node_id, document, signature)


def test_canonical_json_ignores_key_order_and_refuses_nan() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1}) == b'{"a":[1,2],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
