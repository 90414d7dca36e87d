"""Validators approved and revoked on a live run: the decision overrides the config and applies at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from coordinator.ledger.approvals import decide_validator, validator_standings
from protocol.errors import ForbiddenError, IdentityError
from protocol.identity import NodeIdentity
from tests.support.ledger_helpers import register_request
from tests.unit.coordinator.conftest import MakeHarness

pytestmark = pytest.mark.anyio


async def test_approve_and_revoke_apply_to_the_running_ledger(make_harness: MakeHarness) -> None:
    listed = NodeIdentity.generate()
    harness = make_harness(trust__validators_open=False, trust__approved_validators=[listed.node_id])
    newcomer = harness.client()
    with pytest.raises(ForbiddenError, match="validators approve"):
        await newcomer.register(register_request("validator"))
    assert not decide_validator(harness.database, newcomer.identity.node_id, approved=True)  # not registered yet
    await newcomer.register(register_request("validator"))
    await newcomer.pending(limit=4)

    configured = harness.client(listed)
    await configured.register(register_request("validator"))
    assert decide_validator(harness.database, listed.node_id, approved=False)  # registered: at once
    with pytest.raises(ForbiddenError, match="not approved"):
        await configured.pending(limit=4)
    with pytest.raises(ForbiddenError, match="not approved"):  # and the config's list no longer admits it
        await configured.register(register_request("validator"))

    standings = {s.node_id: s for s in validator_standings(harness.database, [listed.node_id])}
    assert (standings[listed.node_id].approved, standings[listed.node_id].source) == (False, "ledger")
    assert (standings[newcomer.identity.node_id].approved, standings[newcomer.identity.node_id].registered) == (
        True,
        True,
    )
    events = [e for e in (await newcomer.events(0, 100)).events if e.kind in ("approve", "revoke")]
    assert [(e.kind, e.subject) for e in events] == [
        ("approve", newcomer.identity.node_id),
        ("revoke", listed.node_id),
    ]
    with pytest.raises(IdentityError, match="keys show --id-only"):
        decide_validator(harness.database, "12D3KooW...", approved=True)
    for client in (newcomer, configured):
        await client.aclose()


def test_the_cli_approves_lists_and_revokes(tmp_path: Path, make_harness: MakeHarness) -> None:
    from coordinator.cli import app

    harness = make_harness()
    config = tmp_path / "run.toml"
    config.write_text(
        tomli_w.dumps({"data_dir": str(harness.config.data_dir), "ledger": {"url": harness.config.ledger.url}})
    )
    node_id = NodeIdentity.generate().node_id
    approved = CliRunner().invoke(app, ["validators", "approve", node_id, "-c", str(config)])
    assert approved.exit_code == 0 and f"validator {node_id} approved" in approved.output, approved.output
    listed = CliRunner().invoke(app, ["validators", "list", "-c", str(config)])
    assert f"{node_id}  approved (ledger), not registered yet" in listed.output
    revoked = CliRunner().invoke(app, ["validators", "revoke", node_id, "-c", str(config)])
    assert revoked.exit_code == 0 and "revoked" in revoked.output
    bad = CliRunner().invoke(app, ["validators", "approve", "12D3KooW...", "-c", str(config)])
    assert bad.exit_code == 1 and "keys show --id-only" in bad.output
