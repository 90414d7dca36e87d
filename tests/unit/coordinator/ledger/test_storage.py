"""Ledger storage on SQLite and PostgreSQL: migrations, append-only events, concurrency, durable nonces."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import DBAPIError

from coordinator.ledger.ledger import Ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.storage import migrations
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import leases, metadata, nodes, schema_version
from protocol.errors import ConfigError
from protocol.identity import NodeIdentity
from protocol.schemas import LeaseRequest
from tests.support.ledger_helpers import CountingPrompts, ledger_config, register_request


@pytest.fixture
def database(ledger_url: str) -> Iterator[Database]:
    db = Database(ledger_url)
    yield db
    db.dispose()


def open_ledger(database: Database, tmp_path: Path, **overrides: object) -> Ledger:
    config = ledger_config(tmp_path, database.url, **overrides)
    return Ledger(database, config, CountingPrompts(), NodeIdentity.generate().node_id)


def test_schema_after_migrations_matches_the_tables(database: Database) -> None:
    assert migrations.migrate(database) == 0
    with database.read() as conn:
        inspector = inspect(conn)
        for table in metadata.sorted_tables:
            found = {column["name"] for column in inspector.get_columns(table.name)}
            assert found == set(table.columns.keys()), table.name
        assert migrations.current_version(conn) == migrations.LATEST_VERSION
    assert migrations.migrate(database) == migrations.LATEST_VERSION  # idempotent


def test_upgrade_from_v1_keeps_the_data(database: Database, tmp_path: Path) -> None:
    migrations.migrate(database, target=1)
    node_id = NodeIdentity.generate().node_id
    with database.write() as conn:
        assert not inspect(conn).has_table("nonces")
        conn.execute(
            text(
                "INSERT INTO run_state VALUES (1, 'demo', :secret, 3, 5, :now)",
            ),
            {"secret": "ab" * 32, "now": time.time()},
        )
        conn.execute(
            text(
                "INSERT INTO nodes VALUES (:id, 'worker', TRUE, 0, :now, '127.0.0.1', '{}', 'hf', 'old', '[]', 0, "
                "7, 1, FALSE, NULL)"
            ),
            {"id": node_id, "now": time.time()},
        )
    ledger = open_ledger(database, tmp_path)  # migrates v1 -> latest on open
    assert ledger.core.secret == "ab" * 32
    status = ledger.status()
    assert (status.current_policy_version, status.num_workers_live) == (3, 1)
    assert [node.num_accepted for node in ledger.stats(10).nodes] == [7]
    assert DatabaseReplayCache(database).remember(node_id, "n" * 32, time.time() + 60)
    with database.read() as conn:
        versions = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version)).scalars()
        assert list(versions) == list(range(1, migrations.LATEST_VERSION + 1))
    # The next group comes after the ones the old coordinator handed out.
    ledger.register(node_id, "127.0.0.1", register_request())
    (task,) = ledger.lease(node_id, LeaseRequest()).tasks
    assert task.task_id == "t5"


def test_a_newer_schema_is_refused(database: Database) -> None:
    migrations.migrate(database)
    with database.write() as conn:
        conn.execute(schema_version.insert().values(version=99, applied_at=time.time()))
    with pytest.raises(ConfigError, match="schema version 99"):
        migrations.migrate(database)


def test_another_runs_ledger_is_refused(database: Database, tmp_path: Path) -> None:
    open_ledger(database, tmp_path)
    with pytest.raises(ConfigError, match="belongs to run 'demo'"):
        open_ledger(database, tmp_path, run_name="other")


def test_events_are_append_only(database: Database, tmp_path: Path) -> None:
    ledger = open_ledger(database, tmp_path)
    node_id = NodeIdentity.generate().node_id
    ledger.register(node_id, "127.0.0.1", register_request())
    for statement in ("UPDATE events SET kind = 'x'", "DELETE FROM events"):
        with pytest.raises(DBAPIError, match="append-only"), database.write() as conn:
            conn.execute(text(statement))
    assert [event.kind for event in ledger.events(0, 10).events] == ["register"]


def test_concurrent_leases_never_share_a_task(database: Database, tmp_path: Path) -> None:
    ledger = open_ledger(database, tmp_path, scheduling__max_leases_per_node=3)
    workers = [NodeIdentity.generate().node_id for _ in range(8)]
    for node_id in workers:
        ledger.register(node_id, "127.0.0.1", register_request())

    def lease_all(node_id: str) -> list[str]:
        return [task.task_id for _ in range(3) for task in ledger.lease(node_id, LeaseRequest()).tasks]

    with ThreadPoolExecutor(max_workers=8) as pool:
        leased = [task_id for found in pool.map(lease_all, workers) for task_id in found]
    assert len(leased) == 24 and len(set(leased)) == 24
    with database.read() as conn:
        active = conn.execute(select(leases.c.task_id).where(leases.c.state == "active")).scalars().all()
        assert sorted(active) == sorted(leased)
        assert conn.execute(select(nodes.c.node_id)).scalars().all() != []


def test_replay_cache_remembers_until_expiry_then_prunes(database: Database) -> None:
    migrations.migrate(database)
    now = [1000.0]
    cache = DatabaseReplayCache(database, clock=lambda: now[0])
    assert cache.remember("node-a", "nonce-1", expires_at=1060.0)
    assert not cache.remember("node-a", "nonce-1", expires_at=1060.0)
    assert cache.remember("node-b", "nonce-1", expires_at=1060.0)
    assert not DatabaseReplayCache(database, clock=lambda: now[0]).remember("node-a", "nonce-1", 1060.0)
    now[0] = 1061.0
    assert cache.remember("node-a", "nonce-1", expires_at=1121.0)  # expired entry may be reused
    assert cache.prune() == 1  # node-b's
    assert not cache.remember("node-a", "nonce-1", expires_at=1121.0)
