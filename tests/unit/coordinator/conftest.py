"""Ledger fixtures: one fresh database per test, on SQLite and (with PRIME_TEST_POSTGRES_URL) PostgreSQL.

PostgreSQL tests share one database created for the session under a random name (dropped at
the end) and get a schema of their own each, so parallel runs and tests never collide.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.storage.engine import Database
from coordinator.serving.app import create_app
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from tests.support.ledger_helpers import (
    CountingPrompts,
    FakeClock,
    ledger_config,
    new_postgres_schema,
    register_request,
    scratch_postgres_database,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_database(postgres_url: str) -> Iterator[str]:
    """A database of this test session's own on the PostgreSQL server, dropped afterwards."""
    with scratch_postgres_database(postgres_url) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty ledger database: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return new_postgres_schema(request.getfixturevalue("postgres_database"))


@dataclass
class LedgerHarness:
    config: CoordinatorConfig
    database: Database
    ledger: Ledger
    replay_cache: DatabaseReplayCache
    app: FastAPI
    coordinator: NodeIdentity
    clock: FakeClock

    def client(self, identity: NodeIdentity | None = None, address: str = "127.0.0.1") -> LedgerClient:
        """A client of the app whose requests come from ``address`` (the TCP peer the app sees)."""
        transport = httpx.ASGITransport(app=self.app, client=(address, 40000))
        return LedgerClient("http://ledger", identity or NodeIdentity.generate(), transport=transport)

    async def worker(self, address: str = "127.0.0.1") -> LedgerClient:
        client = self.client(address=address)
        await client.register(register_request("worker"))
        return client

    async def validator(self) -> LedgerClient:
        client = self.client()
        await client.register(register_request("validator"))
        return client


MakeHarness = Callable[..., LedgerHarness]


@pytest.fixture
def make_harness(ledger_url: str, tmp_path: Path) -> Iterator[MakeHarness]:
    """Build a ledger + app over the test's database; keyword overrides are dotted config keys."""
    made: list[Database] = []

    def make(**overrides: object) -> LedgerHarness:
        config = ledger_config(tmp_path / "run", ledger_url, **overrides)
        database = Database(config.ledger_url)
        made.append(database)
        coordinator = NodeIdentity.generate()
        clock = FakeClock()
        ledger = Ledger(database, config, CountingPrompts(), coordinator.node_id, clock=clock)
        replay_cache = DatabaseReplayCache(database)
        app = create_app(config, ledger, replay_cache)
        return LedgerHarness(config, database, ledger, replay_cache, app, coordinator, clock)

    yield make
    for database in made:
        database.dispose()


@pytest.fixture
def harness(make_harness: MakeHarness) -> LedgerHarness:
    return make_harness()


@pytest.fixture
async def worker(harness: LedgerHarness) -> AsyncIterator[LedgerClient]:
    client = await harness.worker()
    yield client
    await client.aclose()
