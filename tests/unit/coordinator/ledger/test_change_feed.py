"""The change feed: a commit through one process's ledger wakes the waiters of another on the same PostgreSQL ledger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.ledger.change_feed import MAX_PAYLOAD_BYTES, decode_kinds, encode_kinds
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.storage.engine import Database
from environments.prompts import NoPrompts
from tests.support.ledger_helpers import ledger_config, new_postgres_schema


def test_a_payload_names_its_origin_and_stays_under_the_limit() -> None:
    assert decode_kinds(encode_kinds("abc", ["submit:n1", "lease", "verdict"])) == (
        "abc",
        ["lease", "verdict", "submit:n1"],
    )
    many = [f"submit:{i:064d}" for i in range(500)]
    payload = encode_kinds("abc", ["lease", *many])
    assert len(payload.encode()) <= MAX_PAYLOAD_BYTES
    assert decode_kinds(payload)[1][0] == "lease"  # the plain kinds go first, node-scoped ones as far as they fit


@pytest.fixture
def ledgers(tmp_path: Path, postgres_database: str) -> Iterator[list[Ledger]]:
    """Three ledgers as three processes would open them: two on one schema, one on another."""
    shared, other = new_postgres_schema(postgres_database), new_postgres_schema(postgres_database)
    opened: list[Ledger] = []
    try:
        for index, url in enumerate((shared, shared, other)):
            config = ledger_config(tmp_path / f"run{index}", url)
            ledger = Ledger(Database(url), config, NoPrompts(), "coordinator")
            ledger.share_changes()
            opened.append(ledger)
        yield opened
    finally:
        for ledger in opened:
            ledger.stop_sharing_changes()
            ledger.db.dispose()


def commit_event(ledger: Ledger, kind: str, fail: bool = False) -> None:
    with ledger.core.write(None) as conn:
        ledger.core.event(conn, kind, None, None)
        if fail:
            raise RuntimeError("rolled back")


@pytest.mark.postgres
def test_a_commit_wakes_the_other_process_on_the_ledger_and_no_other_ledger(ledgers: list[Ledger]) -> None:
    writer, reader, elsewhere = ledgers
    mark, elsewhere_mark = reader.changes.mark(["publish"]), elsewhere.changes.mark(["publish"])
    with pytest.raises(RuntimeError):
        commit_event(writer, "publish", fail=True)
    assert not reader.changes.wait(["publish"], mark, 0.3)  # a rolled-back write announces nothing
    commit_event(writer, "publish")
    assert reader.changes.wait(["publish"], mark, 5.0)
    assert not elsewhere.changes.wait(["publish"], elsewhere_mark, 0.3)
    own = writer.changes.mark(["publish"])
    commit_event(reader, "lease")
    assert writer.changes.wait(["lease"], (0,), 5.0)
    assert writer.changes.mark(["publish"]) == own  # nothing counted twice or invented


@pytest.mark.postgres
def test_a_process_does_not_count_its_own_commit_twice(ledgers: list[Ledger]) -> None:
    writer, reader, _ = ledgers
    commit_event(writer, "verdict")
    assert reader.changes.wait(["verdict"], (0,), 5.0)
    commit_event(reader, "abandon")  # a round trip through the feed: the writer's own notice has been heard by now
    assert writer.changes.wait(["abandon"], (0,), 5.0)
    assert writer.changes.mark(["verdict"]) == (1,)


@pytest.mark.postgres
def test_a_process_alone_on_the_ledger_announces_nothing(ledgers: list[Ledger]) -> None:
    writer, reader, _ = ledgers
    assert writer.feed is not None
    writer.feed.others = False  # what its maintenance sets when no other API process beats
    mark = reader.changes.mark(["publish"])
    commit_event(writer, "publish")
    assert not reader.changes.wait(["publish"], mark, 0.3)
    writer.feed.others = True
    commit_event(writer, "publish")
    assert reader.changes.wait(["publish"], mark, 5.0)
