"""A bounded schemathesis run against the ledger's own OpenAPI schema: no input makes it answer 5xx.

Every operation gets valid-looking (positive) and schema-violating (negative) requests, each
sent twice: signed by a registered worker (so it reaches validation and the ledger's own
rules) and unsigned. Every answer must be below 500, and every refusal must be an ErrorBody.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from starlette.testclient import TestClient

from coordinator.ledger.ledger import Ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.storage.engine import Database
from coordinator.serving.app import create_app
from protocol.identity import NodeIdentity
from protocol.schemas import ErrorBody, LeaseRequest
from protocol.signing import sign_request
from tests.support.ledger_helpers import CountingPrompts, ledger_config, register_request

EXAMPLES_PER_OPERATION_AND_MODE = 25
TIME_BUDGET_S = 75.0


def check_answer(response: Any, what: str) -> None:
    assert response.status_code < 500, f"{what} -> {response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        ErrorBody.model_validate_json(response.content)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # httpx2 (under TestClient) on schemathesis' kwargs
def test_fuzzing_the_openapi_schema_finds_no_server_error(tmp_path: Path) -> None:
    config = ledger_config(tmp_path, "", api__node_burst=10**9, api__ip_burst=10**9)
    database = Database(config.ledger_url)
    worker = NodeIdentity.generate()
    ledger = Ledger(database, config, CountingPrompts(), NodeIdentity.generate().node_id)
    ledger.register(worker.node_id, "127.0.0.1", register_request())
    ledger.lease(worker.node_id, LeaseRequest(max_tasks=2))  # so lease and submission routes have state
    app = create_app(config, ledger, DatabaseReplayCache(database))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 14
    deadline = time.monotonic() + TIME_BUDGET_S
    num_requests = 0

    def signer(request: Any) -> Any:
        # Starlette's TestClient is built on httpx2, whose Auth class is not httpx's: sign by hand.
        path = request.url.raw_path.decode()
        request.headers.update(sign_request(worker, request.method, path, request.read()))
        return request

    with TestClient(app, raise_server_exceptions=False) as client:
        for operation in operations:
            for mode in schemathesis.GenerationMode:

                @settings(
                    max_examples=EXAMPLES_PER_OPERATION_AND_MODE,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @given(data=st.data())
                def exercise(data: st.DataObject) -> None:
                    nonlocal num_requests
                    # Draw first: returning before the draw once the budget is spent would make data generation
                    # depend on the clock, which hypothesis reports as a flaky strategy.
                    case = data.draw(operation.as_strategy(generation_mode=mode))  # noqa: B023
                    if time.monotonic() > deadline:
                        return
                    kwargs = case.as_transport_kwargs(base_url="http://testserver")
                    kwargs.pop("cookies", None)
                    what = f"{case.method} {case.formatted_path} ({mode.value})"  # noqa: B023
                    check_answer(client.request(**kwargs, auth=signer), what + " signed")
                    check_answer(client.request(**kwargs), what + " unsigned")
                    num_requests += 2

                try:
                    exercise()
                except Unsatisfiable:  # nothing to violate (an operation without parameters or body)
                    assert mode is schemathesis.GenerationMode.NEGATIVE
    database.dispose()
    assert num_requests >= 200, f"only {num_requests} requests fit the time budget"
