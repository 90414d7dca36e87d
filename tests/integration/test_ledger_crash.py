"""Crash safety: SIGKILL a real `prime-coordinator start` during a stream of signed submissions, restart it.

Every submission the ledger acknowledged must still be there after the restart (a retry is
answered as a duplicate of the same submission id), and every lease it handed out must still
exist: either submitted, or active and renewable by its worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from sqlalchemy import select

from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import leases, submissions
from protocol.errors import ConflictError, PrimeError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, SubmitRequest, Task
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import (
    new_postgres_schema,
    register_request,
    scratch_postgres_database,
    submission_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_WORKERS = 4
KILL_AFTER_ACKS = 40


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield ""  # the default: ledger.db in the run directory
        return
    with scratch_postgres_database(request.getfixturevalue("postgres_url")) as database_url:
        yield new_postgres_schema(database_url)


class Stream:
    """What the ledger acknowledged to the workers before it was killed."""

    def __init__(self) -> None:
        self.leased: dict[str, tuple[NodeIdentity, Task]] = {}
        self.acked: dict[str, tuple[NodeIdentity, SubmitRequest, str]] = {}
        self.killed = asyncio.Event()


async def work(url: str, identity: NodeIdentity, stream: Stream) -> None:
    async with LedgerClient(url, identity, timeout_s=10) as client:
        await client.register(register_request())
        while not stream.killed.is_set():
            try:
                for task in (await client.lease(LeaseRequest(max_tasks=2))).tasks:
                    stream.leased[task.lease_id] = (identity, task)
                    request = submission_for(task)
                    answer = await client.submit(request)
                    stream.acked[task.lease_id] = (identity, request, answer.submission_id)
            except PrimeError:
                return  # the coordinator is gone; what was not acknowledged may or may not be stored


async def kill_midstream(coordinator: CoordinatorProcess, stream: Stream) -> None:
    while len(stream.acked) < KILL_AFTER_ACKS:
        await asyncio.sleep(0.005)
    coordinator.kill()
    stream.killed.set()


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_submission_and_no_lease(tmp_path: Path, ledger_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "crash",
        "data_dir": str(tmp_path / "run"),
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 100000, "ip_burst": 100000},
        "ledger": {"url": ledger_url},
        "scheduling": {"prompts_per_task": 2, "group_size": 2, "max_tokens": 8, "lease_ttl_s": 600},
        "sources": {"allow": ["127.0.0.0/8"]},  # no validator: probation would stop the stream before the kill
    }
    config_path = tmp_path / "crash.toml"
    config_path.write_text(tomli_w.dumps(config))
    coordinator = CoordinatorProcess(config_path, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    stream = Stream()
    try:
        coordinator.start(url)

        async def run_stream() -> None:
            workers = [work(url, NodeIdentity.generate(), stream) for _ in range(NUM_WORKERS)]
            await asyncio.gather(kill_midstream(coordinator, stream), *workers)

        asyncio.run(run_stream())
        assert len(stream.acked) >= KILL_AFTER_ACKS
        coordinator.start(url)
        asyncio.run(check_after_restart(url, stream))
        log = (tmp_path / "coordinator.log").read_text()
        assert log.count("ledger API listening on http://127.0.0.1:") == 2
    finally:
        coordinator.stop()
    db_url = ledger_url or f"sqlite:///{tmp_path / 'run' / 'ledger.db'}"
    database = Database(db_url)
    with database.read() as conn:
        stored = dict(conn.execute(select(submissions.c.lease_id, submissions.c.submission_id)).all())
        lease_states = dict(conn.execute(select(leases.c.lease_id, leases.c.state)).all())
    database.dispose()
    for lease_id, (_, _, submission_id) in stream.acked.items():
        assert stored[lease_id] == submission_id
    assert set(stream.leased) <= set(lease_states)
    assert all(lease_states[lease_id] == "submitted" for lease_id in stream.leased)


async def check_after_restart(url: str, stream: Stream) -> None:
    clients: dict[str, LedgerClient] = {}
    for identity, _ in stream.leased.values():
        clients.setdefault(identity.node_id, LedgerClient(url, identity, timeout_s=10))
    for lease_id, (identity, task) in stream.leased.items():
        client = clients[identity.node_id]
        if lease_id in stream.acked:
            _, request, submission_id = stream.acked[lease_id]
            again = await client.submit(request)
            assert again.duplicate and again.submission_id == submission_id
        else:  # leased, submission not acknowledged: stored before the kill, or still active and renewable
            try:
                assert (await client.renew(lease_id)).state == "active"
                stored_before_kill = False
            except ConflictError as exc:
                assert "submitted" in exc.message
                stored_before_kill = True
            assert (await client.submit(submission_for(task))).duplicate == stored_before_kill
    status = await next(iter(clients.values())).status()
    assert status.num_submissions_pending == len(stream.leased)
    for client in clients.values():
        await client.aclose()
