"""Property test: no number a node sends, however hostile, makes the ledger answer 5xx or store what breaks a read.

Every signed route (register, heartbeat, lease, renew, abandon, submit, pending, verdict,
publish) gets a well-formed body in which hypothesis replaces one to three numbers (the wire
version included) with NaN, an infinity, a huge or negative value or a value of another type,
sent as raw JSON (Python writes NaN and Infinity literals, as a hostile client would). Every
answer must be below 500 and every refusal an ErrorBody. Then everything stored is read back:
strictly as JSON (no NaN anywhere), through the wire schemas, and through the public GET routes;
and every submission still pending takes an honest verdict and is decided, so no stored vote
can wedge it. Runs on SQLite and, with PRIME_TEST_POSTGRES_URL, PostgreSQL, within a time budget.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from starlette.testclient import TestClient

from coordinator.ledger.storage.tables import events, nodes, submissions, verdict_votes
from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE
from protocol.schemas import (
    MAX_TOKENS_PER_S,
    Dashboard,
    ErrorBody,
    EventPage,
    LeaseRequest,
    PendingSubmissions,
    RunStats,
    RunStatus,
    SignedManifest,
    SubmitRequest,
    Verdict,
    VerdictResponse,
)
from protocol.signing import sign_document, sign_request
from tests.support.ledger_helpers import register_request, signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

TIME_BUDGET_S = 25.0
MAX_EXAMPLES = 400
MIN_REQUESTS = 60
MUTANTS: list[object] = [
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    1e30,
    -1.0,
    -(2**63),
    2**64,
    10**30,
    0,
    0.5,
    1000,  # a token id outside the test policy's vocabulary of 64
    "1",
    True,
    None,
    [],
    {},
]
ROUTES = ("register", "heartbeat", "lease", "renew", "abandon", "submit", "pending", "verdict", "publish")
Path = tuple[str | int, ...]


def number_paths(value: object, path: Path = ()) -> Iterator[Path]:
    """Where the numbers of a JSON document are (bools are not numbers here)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from number_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from number_paths(item, (*path, index))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path


def replaced(document: Any, path: Path, new: object) -> Any:
    """``document`` with the value at ``path`` replaced (unchanged where an earlier mutation removed the path)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(document, dict) and head in document:
        return {**document, head: replaced(document[head], rest, new)}
    if isinstance(document, list) and isinstance(head, int) and head < len(document):
        copy = list(document)
        copy[head] = replaced(copy[head], rest, new)
        return copy
    return document


def document_signature(identity: NodeIdentity, document: dict[str, Any]) -> str:
    """The signature an honest client would attach; NaN has no canonical JSON, so then any signature."""
    try:
        return sign_document(identity, document)
    except ValueError:
        return "A" * 88


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"stored JSON holds {name}: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


class Probe:
    """Sends mutated requests for one harness and checks every answer."""

    def __init__(self, harness: LedgerHarness, client: TestClient) -> None:
        self.harness = harness
        self.client = client
        self.worker = NodeIdentity.generate()
        self.ledger = harness.ledger
        self.ledger.register(self.worker.node_id, "127.0.0.1", register_request("worker"))
        self.num_requests = 0
        self.next_version = 1

    def send(self, identity: NodeIdentity, method: str, path: str, document: object = None, **headers: str) -> Any:
        body = b"" if document is None else json.dumps(document).encode()
        signed = {"Content-Type": "application/json", **sign_request(identity, method, path, body), **headers}
        response = self.client.request(method, path, content=body or None, headers=signed)
        self.num_requests += 1
        assert response.status_code < 500, f"{method} {path} {body[:300]!r} -> {response.text[:500]}"
        if response.status_code >= 400:
            ErrorBody.model_validate_json(response.content)
        return response

    def fresh_task(self) -> Any:
        (task,) = self.ledger.lease(self.worker.node_id, LeaseRequest(max_tasks=1)).tasks
        return task

    def pending_submission(self) -> tuple[str, int]:
        """A new pending submission (id, number of rollouts), made in-process by the honest worker."""
        request = submission_for(self.fresh_task())
        signature = sign_document(self.worker, request.model_dump(mode="json"))
        answer = self.ledger.submit(self.worker.node_id, request, signature)
        return answer.submission_id, len(request.rollouts)

    def new_node(self, role: str) -> NodeIdentity:
        identity = NodeIdentity.generate()
        self.ledger.register(identity.node_id, "127.0.0.1", register_request(role))
        return identity

    def base(self, route: str) -> tuple[NodeIdentity, str, str, Any]:
        """(signer, method, path, document) of a well-formed request on ``route``."""
        if route == "register":
            return NodeIdentity.generate(), "POST", "/v1/nodes/register", register_request().model_dump(mode="json")
        if route == "heartbeat":
            body = {"v": 1, "policy_versions_held": [0, 1], "engine": "hf", "tokens_per_s": 12.5}
            body["hardware"] = register_request().hardware.model_dump(mode="json")
            return self.worker, "POST", "/v1/nodes/heartbeat", body
        if route == "lease":
            return self.worker, "POST", "/v1/leases", {"v": 1, "max_tasks": 1, "policy_versions_held": [0]}
        if route in ("renew", "abandon"):
            return self.worker, "POST", f"/v1/leases/{route}", {"v": 1, "lease_id": self.fresh_task().lease_id}
        if route == "submit":
            return self.worker, "POST", "/v1/submissions", submission_for(self.fresh_task()).model_dump(mode="json")
        if route == "pending":
            return self.new_node("validator"), "GET", "/v1/submissions/pending", {"limit": 4}
        if route == "verdict":
            submission_id, num_rollouts = self.pending_submission()
            body = {"v": 1, "submission_id": submission_id, "accepted": True, "reasons": []}
            return self.new_node("validator"), "POST", "/v1/verdicts", {**body, "rewards": [0.5] * num_rollouts}
        assert route == "publish"
        self.next_version += 1
        signed = signed_manifest(self.harness.coordinator, self.next_version).model_dump(mode="json")
        return self.harness.coordinator, "POST", "/v1/policy-versions", signed

    def mutated(self, route: str, mutations: list[tuple[int, object]]) -> None:
        identity, method, path, document = self.base(route)
        paths = list(number_paths(document))
        for choice, new in mutations:
            document = replaced(document, paths[choice % len(paths)], new)
        if route == "pending":  # the number travels in the query
            self.send(identity, "GET", f"{path}?limit={json.dumps(document['limit'])}")
            return
        headers = {}
        if route == "submit":
            headers[HEADER_SUBMISSION_SIGNATURE] = document_signature(identity, document)
        if route == "publish" and isinstance(document.get("manifest"), dict):  # re-signed: reaches the ledger
            document = {**document, "signature_b64": document_signature(identity, document["manifest"])}
        self.send(identity, method, path, document, **headers)

    def read_back(self) -> None:
        """Everything stored reads back: as strict JSON, through the schemas, and through the GET routes."""
        with self.harness.database.read() as conn:
            for row in conn.execute(select(events.c.data_json)).all():
                strict_json(row.data_json)
            for row in conn.execute(select(submissions.c.body_json, submissions.c.verdict_json)).all():
                SubmitRequest.model_validate(strict_json(row.body_json))
                if row.verdict_json is not None:
                    Verdict.model_validate(strict_json(row.verdict_json))
            for row in conn.execute(select(verdict_votes.c.verdict_json)).all():
                Verdict.model_validate(strict_json(row.verdict_json))
            for row in conn.execute(select(nodes)).all():
                assert 0 <= row.tokens_per_s <= MAX_TOKENS_PER_S, row
                strict_json(row.hardware_json)
                strict_json(row.versions_held_json)
        for path, model in (("/v1/status", RunStatus), ("/v1/stats", RunStats), ("/v1/dashboard", Dashboard)):
            response = self.client.get(path)
            assert response.status_code == 200, f"{path}: {response.text[:500]}"
            model.model_validate_json(response.content)
        self.client.get("/v1/policy-versions/latest").raise_for_status()
        SignedManifest.model_validate_json(self.client.get("/v1/policy-versions/latest").content)
        after = 0
        while True:
            response = self.client.get(f"/v1/events?after={after}&limit=1000")
            assert response.status_code == 200, response.text[:500]
            page = EventPage.model_validate_json(response.content)
            if not page.events:
                break
            after = page.next_after

    def decide_everything_pending(self) -> int:
        """An honest verdict on every pending submission (fresh validators): each is decided. How many."""
        decided = 0
        while True:
            validator = self.new_node("validator")
            response = self.send(validator, "GET", "/v1/submissions/pending?limit=256")
            pending = PendingSubmissions.model_validate_json(response.content).submissions
            if not pending:
                return decided
            for item in pending:
                verdict = {"v": 1, "submission_id": item.submission_id, "accepted": True, "reasons": []}
                verdict["rewards"] = [0.25] * len(item.submission.rollouts)
                answer = self.send(validator, "POST", "/v1/verdicts", verdict)
                assert answer.status_code == 200, answer.text
                assert VerdictResponse.model_validate_json(answer.content).status == "accepted"
                decided += 1


def test_mutated_numbers_never_get_a_server_error_or_poison_storage(make_harness: MakeHarness) -> None:
    harness = make_harness(
        api__node_burst=10**9,
        api__ip_burst=10**9,
        trust__ban_after_rejections=10**9,
        scheduling__max_leases_per_node=10**6,
        scheduling__max_open_leases=10**6,
        policy__vocab_size=64,
    )
    coordinator = harness.coordinator
    harness.ledger.publish(signed_manifest(coordinator, 0))
    harness.ledger.publish(signed_manifest(coordinator, 1))
    deadline = time.monotonic() + TIME_BUDGET_S
    routes_hit: set[str] = set()
    with TestClient(harness.app, raise_server_exceptions=False) as client:
        probe = Probe(harness, client)

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            route=st.sampled_from(ROUTES),
            mutations=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(MUTANTS)), min_size=1, max_size=3),
        )
        def exercise(route: str, mutations: list[tuple[int, object]]) -> None:
            if time.monotonic() > deadline:
                return
            probe.mutated(route, mutations)
            routes_hit.add(route)

        exercise()
        probe.read_back()
        assert probe.decide_everything_pending() > 0
        probe.read_back()
    assert routes_hit == set(ROUTES), routes_hit
    assert probe.num_requests >= MIN_REQUESTS, f"only {probe.num_requests} requests fit the time budget"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_literals_are_refused_naming_the_field(harness: LedgerHarness, literal: str) -> None:
    """The literal forms a hostile client can write (json.loads reads 1e999 as infinity)."""
    worker = NodeIdentity.generate()
    harness.ledger.register(worker.node_id, "127.0.0.1", register_request())
    body = f'{{"v":1,"policy_versions_held":[0],"tokens_per_s":{literal}}}'.encode()
    headers = {"Content-Type": "application/json", **sign_request(worker, "POST", "/v1/nodes/heartbeat", body)}
    with TestClient(harness.app, raise_server_exceptions=False) as client:
        response = client.post("/v1/nodes/heartbeat", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert "tokens_per_s" in ErrorBody.model_validate_json(response.content).detail
