"""Attacks that live permissionless RL networks have met, through a real coordinator and validator.

A coordinator, a `prime-validator run` and a malicious worker with a second identity it controls
(:mod:`tests.support.malicious_worker`) on 127.0.0.1, no honest worker (so a task the attacker
abandons comes back to its second identity). Every attack is refused at the door with a 4xx and a reason, or rejected by
the validator by the check aimed at it; the attacker's honest control group is accepted, so the
rejections are the checks', not the network's:

- a worker-declared prompt/completion split, loss mask or second copy of the tokens (text, prompt ids):
  refused by the schema, so what is trained on is the ledger's prompt and the proven completion;
- tokens after the first EOS (filler the policy itself drew, to the cap): the termination check;
- EOS suppressed to reach the cap: the sampling replay, where the seeded draw was EOS;
- rollouts generated for an abandoned lease, submitted under the task's next lease by another
  identity: the sampling replay, since every lease draws with its own seed; the same identity never
  gets the task back at all (the ledger leases a task to no node that held it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from coordinator.ledger.storage.tables import accepted_groups
from tests.support.malicious_worker import (
    DECLARED_FIELDS,
    EARLIER_LEASE_ATTACKS,
    NOT_LEASED_BACK,
    TERMINATION_ATTACKS,
    attack_as_rl_networks_were,
)
from tests.support.network import ledger_rows, running_network

pytestmark = pytest.mark.slow

REJECTED_BY = {
    "padded_after_eos": "termination: EOS at position",
    "eos_suppressed": "sampling:",
    "earlier_lease_by_another_identity": "sampling:",
}
"""The reason each attack that passes the door must be rejected with (in the reason after the rollout label)."""


def test_attacks_live_rl_networks_met_are_refused_or_rejected(tmp_path: Path) -> None:
    sections: dict[str, dict[str, Any]] = {
        "trust": {"ban_after_rejections": 100},
        # The attacker holds the tasks it passes over while it looks for one it wants (at most a few).
        "scheduling": {"lease_ttl_s": 300, "max_leases_per_node": 16},
    }
    with running_network(tmp_path, sections=sections) as net:
        validator = net.start_validator()
        attacker = asyncio.run(attack_as_rl_networks_were(net.url, net.checkpoints[0]))
        outcomes = {outcome.attack: outcome for outcome in attacker.outcomes}
        assert set(outcomes) == {*DECLARED_FIELDS, "honest_control", *TERMINATION_ATTACKS, *EARLIER_LEASE_ATTACKS}

        for name, (field_name, _value) in DECLARED_FIELDS.items():
            assert outcomes[name].status == 400, outcomes[name]
            assert field_name in outcomes[name].reason, outcomes[name]

        # the same identity never gets its abandoned task back (lease scheduling), so it has nothing to resubmit
        assert outcomes["earlier_lease_by_the_same_identity"].reason == NOT_LEASED_BACK, outcomes
        judged: dict[str, str] = {}
        for name in ("honest_control", *REJECTED_BY):
            submission_id = outcomes[name].submission_id
            assert submission_id is not None, outcomes[name]  # past the door: the validator's to judge
            judged[name] = submission_id
        net.expect_verdicts(judged, REJECTED_BY)

        # Of the attacker's submissions only the honest control reaches the set training batches come from.
        accepted = {row.submission_id for row in ledger_rows(net.root, select(accepted_groups))}
        assert accepted == {judged["honest_control"]}
        assert validator.poll() is None, net.worker_log("validator")
