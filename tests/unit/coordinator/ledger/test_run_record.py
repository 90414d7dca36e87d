"""The run record API replicas start from: the coordinator's signed run spec and shared settings, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.ledger.ledger import Ledger
from coordinator.ledger.run_record import record_run, recorded_run
from coordinator.ledger.run_spec import signed_run_spec
from coordinator.ledger.storage.engine import Database
from coordinator.serving.replica import run_api_replica
from environments.prompts import NoPrompts
from protocol.errors import StartupError
from protocol.identity import NodeIdentity
from tests.support.ledger_helpers import ledger_config


def test_a_replica_takes_the_coordinators_spec_and_settings(tmp_path: Path, ledger_url: str) -> None:
    coordinator = ledger_config(tmp_path / "run", ledger_url, scheduling__group_size=8, trust__validators_open=False)
    replica = ledger_config(tmp_path / "replica", ledger_url, api__port=9999)
    database = Database(ledger_url)
    try:
        with pytest.raises(StartupError, match=r"no coordinator has started a run.*without --api-only"):
            recorded_run(database, replica)  # an empty database
        identity = NodeIdentity.generate()
        Ledger(database, coordinator, NoPrompts(), identity.node_id)
        with pytest.raises(StartupError, match="no coordinator has started a run"):
            recorded_run(database, replica)  # a ledger, but no coordinator recorded its spec in it yet
        signed = signed_run_spec(coordinator, identity, NoPrompts())
        record_run(database, signed, coordinator)
        spec, config = recorded_run(database, replica)
        assert spec == signed
        assert config.scheduling == coordinator.scheduling and config.trust == coordinator.trust
        assert config.api.port == 9999  # where it listens is its own
        with pytest.raises(StartupError, match=r"holds run 'demo'.*names 'other'"):
            recorded_run(database, replica.model_copy(update={"run_name": "other"}))
        forged = signed.model_copy(update={"spec": signed.spec.model_copy(update={"max_turns": 5})})
        record_run(database, forged, coordinator)
        with pytest.raises(StartupError, match="not signed"):
            recorded_run(database, replica)
    finally:
        database.dispose()


def test_a_replica_on_sqlite_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="PostgreSQL ledger"):
        run_api_replica(ledger_config(tmp_path / "run", f"sqlite:///{tmp_path / 'ledger.db'}"))
