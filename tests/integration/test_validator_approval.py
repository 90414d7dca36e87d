"""Approving and revoking a validator on a live run, through the real `prime-coordinator` commands."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from protocol.errors import ForbiddenError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import new_postgres_schema, register_request, scratch_postgres_database

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "sqlite":
        yield ""
        return
    with scratch_postgres_database(request.getfixturevalue("postgres_url")) as database_url:
        yield new_postgres_schema(database_url)


def decide(config: Path, verb: str, node_id: str) -> str:
    command = [str(BIN / "prime-coordinator"), "validators", verb, node_id, "-c", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_validator_is_approved_and_revoked_without_a_restart(tmp_path: Path, ledger_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "run.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "run_name": "approvals",
                "data_dir": str(tmp_path / "run"),
                "api": {"host": "127.0.0.1", "port": port},
                "ledger": {"url": ledger_url},
                "trust": {"validators_open": False},
                "validation": {"builtin_enabled": False},
            }
        )
    )
    coordinator = CoordinatorProcess(config, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    validator = NodeIdentity.generate()

    async def register_and_ask() -> None:
        async with LedgerClient(url, validator) as client:
            await client.register(register_request("validator"))
            await client.pending(limit=4)

    try:
        coordinator.start(url, timeout_s=180)
        with pytest.raises(ForbiddenError, match="validators approve"):
            asyncio.run(register_and_ask())
        assert "approved" in decide(config, "approve", validator.node_id)
        asyncio.run(register_and_ask())  # the same coordinator process, no restart
        assert "takes effect now" in decide(config, "revoke", validator.node_id)
        with pytest.raises(ForbiddenError, match="not approved"):
            asyncio.run(register_and_ask())
    finally:
        coordinator.stop()
