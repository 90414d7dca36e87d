"""A ledger has one coordinator at a time and belongs to one key; reset drops all of it (SQLite, PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.ledger.ledger import Ledger
from coordinator.ledger.ownership import check_owner, drop_ledger, hold_ledger, ledger_tables
from coordinator.ledger.storage.engine import Database
from environments.prompts import NoPrompts
from protocol.errors import StartupError
from protocol.identity import NodeIdentity
from tests.support.ledger_helpers import ledger_config


def test_the_ledger_is_held_by_one_coordinator(tmp_path: Path, ledger_url: str) -> None:
    first, second = Database(ledger_url), Database(ledger_url)
    try:
        with hold_ledger(first), pytest.raises(StartupError, match="is in use by prime-coordinator"):
            hold_ledger(second)
        hold_ledger(second).release()  # free once released
    finally:
        first.dispose()
        second.dispose()


def test_a_ledger_signed_by_another_key_is_refused_and_reset_empties_it(tmp_path: Path, ledger_url: str) -> None:
    from coordinator.loop.policies import policy_store, publish_policy
    from tests.support.tiny_model import save_tiny_model

    config = ledger_config(tmp_path / "run", ledger_url)
    database = Database(ledger_url)
    owner, stranger = NodeIdentity.generate(), NodeIdentity.generate()
    try:
        ledger = Ledger(database, config, NoPrompts(), owner.node_id)
        check_owner(ledger, stranger.node_id, tmp_path)  # nothing published yet: any key may start the run
        publish_policy(save_tiny_model(tmp_path / "ckpt"), 0, owner, policy_store(config), ledger, config)
        check_owner(ledger, owner.node_id, tmp_path)
        with pytest.raises(StartupError, match=f"signed by coordinator {owner.node_id}.*prime-coordinator reset"):
            check_owner(ledger, stranger.node_id, tmp_path)
        assert "policy_versions" in ledger_tables(database)
        drop_ledger(database)
        assert ledger_tables(database) == []
        fresh = Ledger(database, config, NoPrompts(), stranger.node_id)  # migrates again from nothing
        assert fresh.status().current_policy_version == 0
        check_owner(fresh, stranger.node_id, tmp_path)
    finally:
        database.dispose()
