"""Validators in a real network: every attack refused or rejected, and the built-in validator.

A coordinator, an honest `prime-worker join`, a `prime-validator run` and a malicious worker
speaking the public protocol (:mod:`tests.support.malicious_worker`) on 127.0.0.1. Every
attack is refused at the door with a 4xx and a reason, or rejected by the validator; the
authenticated ones count against the attacker, who is banned at ``ban_after_rejections``;
the node it impersonated loses nothing; none of its rollouts reaches the accepted set that
training batches are built from, and every honest submission is accepted. A second test runs
the coordinator's built-in validator (`validation.builtin_enabled`) as the only validator of a
closed run and checks that the coordinator stops it. Against a real coordinator, an approved
validator cannot vote on a submission it was never handed (its id is public), and nobody can
read a vote before the quorum decides.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from coordinator.ledger.storage.tables import accepted_groups, submissions
from protocol.errors import ForbiddenError
from protocol.identity import load_or_create_identity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, SubmitRequest, Verdict
from tests.integration.test_sybil_network import client_from, start_coordinator
from tests.support.ledger_helpers import register_request, submission_for
from tests.support.malicious_worker import PROOF_ATTACKS, attack_until_banned
from tests.support.network import Network, ledger_rows, running_network
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow

COUNTED_DOOR_ATTACKS = ("replay_same_lease", "policy_version_never_had", "wrong_task_id")
"""Refused at the door and counted against the attacker (it signed them)."""
UNCOUNTED_DOOR_ATTACKS = {"forged_signature": 401, "inflated_reward": 400}
"""Refused at the door, not counted: a forgery proves nothing of its signer; a schema error may be version skew."""
NUM_COUNTED = len(COUNTED_DOOR_ATTACKS) + 1 + len(PROOF_ATTACKS)  # + the copy under a new lease (validator)


def node_row(net: Network, node_id: str) -> dict[str, Any]:
    nodes = httpx.get(f"{net.url}/v1/stats", params={"limit": 1000}, timeout=5).json()["nodes"]
    (row,) = [node for node in nodes if node["node_id"] == node_id]
    return dict(row)


def test_every_attack_is_refused_or_rejected_and_the_attacker_banned(tmp_path: Path) -> None:
    sections: dict[str, dict[str, Any]] = {
        "trust": {"ban_after_rejections": NUM_COUNTED},
        "scheduling": {"lease_ttl_s": 120},
    }
    with running_network(tmp_path, sections=sections) as net:
        net.start_worker("worker-honest", "hf", [])
        validator = net.start_validator()
        honest_id = load_or_create_identity(net.root / "worker-honest").node_id
        wait_until(lambda: any(v["accepted"] for v in net.verdicts().values()), 300, "an accepted honest group")
        (honest_row, *_) = [row for row in ledger_rows(net.root, select(submissions)) if row.status == "accepted"]
        honest = SubmitRequest.model_validate_json(honest_row.body_json)

        attacker = asyncio.run(attack_until_banned(net.url, net.checkpoints[0], honest_id, honest))
        attacker_id = attacker.identity.node_id
        outcomes = {outcome.attack: outcome for outcome in attacker.outcomes}
        assert set(outcomes) == {*COUNTED_DOOR_ATTACKS, *UNCOUNTED_DOOR_ATTACKS, "replay_under_new_lease"} | set(
            PROOF_ATTACKS
        )
        for name, status in UNCOUNTED_DOOR_ATTACKS.items():
            assert outcomes[name].status == status, outcomes[name]
        for name in COUNTED_DOOR_ATTACKS:
            assert outcomes[name].status in (403, 409), outcomes[name]
            assert outcomes[name].reason, outcomes[name]
        assert "reward" in outcomes["inflated_reward"].reason

        # Whatever got past the door was rejected by the validator, with reasons.
        verdicts = net.verdicts()
        judged = [o for o in attacker.outcomes if o.submission_id is not None]
        assert outcomes["replay_under_new_lease"].submission_id is not None
        for outcome in judged:
            verdict = verdicts[outcome.submission_id]  # type: ignore[index]
            assert not verdict["accepted"] and verdict["reasons"], (outcome, verdict)
        refused = [o for o in attacker.outcomes if o.submission_id is None]
        assert all(o.status is not None and 400 <= o.status < 500 for o in refused), refused

        row = node_row(net, attacker_id)
        assert row["banned"] and row["num_rejected"] == NUM_COUNTED, row
        assert [ban["node_id"] for ban in net.events("ban")] == [attacker_id]
        impersonated = node_row(net, honest_id)
        assert (impersonated["banned"], impersonated["num_rejected"]) == (False, 0), impersonated

        # Nothing of the attacker's reaches the accepted set; the replayed honest group counts once.
        owner = {r.submission_id: r.node_id for r in ledger_rows(net.root, select(submissions))}
        accepted = ledger_rows(net.root, select(accepted_groups))
        assert all(owner[group.submission_id] != attacker_id for group in accepted)
        assert sum(1 for group in accepted if group.task_id == honest.task_id) == 1

        # Honest work, before and after the attacks, is all accepted.
        def honest_after_ban() -> bool:
            last_ban = net.events("ban")[-1]["event_id"]
            return any(e["event_id"] > last_ban and e["data"]["worker_id"] == honest_id for e in net.events("verdict"))

        wait_until(honest_after_ban, 240, "an honest verdict after the ban")
        honest_verdicts = [v for v in net.verdicts().values() if v["worker_id"] == honest_id]
        rejected = [v["reasons"] for v in honest_verdicts if not v["accepted"]]
        assert honest_verdicts and not rejected, rejected[:3]
        assert validator.poll() is None, net.worker_log("validator")


def test_builtin_validator_audits_a_closed_run_and_stops_with_the_coordinator(tmp_path: Path) -> None:
    sections: dict[str, dict[str, Any]] = {"trust": {"validators_open": False}, "validation": {"builtin_enabled": True}}
    with running_network(tmp_path, sections=sections) as net:
        builtin_id = load_or_create_identity(net.root / "run" / "builtin-validator").node_id
        net.start_worker("worker", "hf", [])

        def two_verdicts() -> bool:
            return len(net.events("verdict")) >= 2

        wait_until(two_verdicts, 300, "the built-in validator to judge two groups")
        verdicts = net.events("verdict")
        assert {event["node_id"] for event in verdicts} == {builtin_id}
        rejected = [event["data"]["reasons"] for event in verdicts if not event["data"]["accepted"]]
        assert not rejected, rejected[:3]
        log_path = net.root / "run" / "builtin-validator.log"
        assert "accepted s-" in log_path.read_text()
        found = re.search(r"built-in validator started \(pid (\d+)\)", (net.root / "coordinator.log").read_text())
        assert found, (net.root / "coordinator.log").read_text()[-2000:]
        pid = int(found.group(1))
        os.kill(pid, 0)  # running
        outsider = net.start_validator("outsider")  # a closed run refuses a key nobody approved
        assert outsider.wait(timeout=120) != 0
        assert "not approved" in net.worker_log("outsider")
        net.coordinator.stop()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        summaries = [json.loads(line) for line in log_path.read_text().splitlines() if '"samples_per_s"' in line]
        assert summaries and summaries[-1]["num_accepted"] >= 2 and summaries[-1]["samples_per_s"] > 0


def test_two_validators_must_agree_on_the_samples_the_ledger_picked(tmp_path: Path) -> None:
    sections: dict[str, dict[str, Any]] = {"validation": {"validators_per_submission": 2, "audit_fraction": 0.25}}
    with running_network(tmp_path, sections=sections) as net:
        net.start_worker("worker", "hf", [])
        first = net.start_validator("validator-1")
        wait_until(lambda: len(net.events("vote")) >= 2, 300, "the first validator to vote")
        assert net.events("verdict") == []  # one vote decides nothing
        second = net.start_validator("validator-2")
        wait_until(lambda: len(net.events("verdict")) >= 2, 300, "two decided groups")
        ids = {load_or_create_identity(net.root / name).node_id for name in ("validator-1", "validator-2")}
        for event in net.events("verdict"):
            assert event["data"]["accepted"], event["data"]["reasons"]
            assert set(event["data"]["validators"]) == ids
        votes = net.events("vote")
        assert len({(e["subject"], e["node_id"]) for e in votes}) == len(votes)  # nobody voted twice
        assert first.poll() is None and second.poll() is None
    # Each validator prefilled a quarter of the samples (2 of 8 per group) yet judged all of them.
    for name in ("validator-1", "validator-2"):
        lines = (net.root / f"{name}.log").read_text().splitlines()
        (last, *_) = [json.loads(line) for line in reversed(lines) if '"samples_per_s"' in line]
        assert last["num_samples_verified"] * 4 == 8 * (last["num_accepted"] + last["num_rejected"]), last


@pytest.fixture
def quorum_two_url(tmp_path: Path) -> Iterator[str]:
    validation = {"validators_per_submission": 2, "hand_out_claim_s": 120.0}  # validators split the pending list
    yield from start_coordinator(tmp_path, {"allow": ["127.0.0.0/8"]}, validation=validation)


async def worker_and_validators(url: str, num_validators: int) -> list[LedgerClient]:
    """A registered worker and ``num_validators`` registered validators, all from 127.0.0.1."""
    clients = [client_from(url, "127.0.0.1") for _ in range(num_validators + 1)]
    await clients[0].register(register_request())
    for validator in clients[1:]:
        await validator.register(register_request("validator"))
    return clients


def test_verdicts_count_only_on_hand_outs_and_stay_private_until_the_quorum(quorum_two_url: str) -> None:
    async def scenario() -> None:
        url = quorum_two_url
        worker, intruder, first, second = await worker_and_validators(url, 3)
        (task,) = (await worker.lease(LeaseRequest())).tasks
        submission_id = (await worker.submit(submission_for(task))).submission_id
        public = httpx.get(f"{url}/v1/events", params={"limit": 1000}, timeout=10).json()["events"]
        assert submission_id in {event["subject"] for event in public}  # the id is public ...
        copied = Verdict(submission_id=submission_id, accepted=False, reasons=["never audited"])
        with pytest.raises(ForbiddenError, match="never handed to validator"):
            await intruder.post_verdict(copied)  # ... but a verdict needs the ledger's hand-out
        secret = "toploc: mismatch at chunk 2 (private-9c1e)"
        for validator in (first, second):
            await validator.pending()
        vote = Verdict(submission_id=submission_id, accepted=True, rewards=[0.123456789] * 4, reasons=[secret])
        assert (await first.post_verdict(vote)).status == "pending"
        for path in ("/v1/events", "/v1/stats", "/v1/dashboard", "/v1/status"):
            text = httpx.get(f"{url}{path}", params={"limit": 1000} if path != "/v1/dashboard" else {}, timeout=10).text
            assert secret not in text and "0.123456789" not in text, f"{path} shows a vote before the quorum"
        assert (await second.post_verdict(vote)).status == "accepted"
        events = httpx.get(f"{url}/v1/events", params={"limit": 1000}, timeout=10).json()["events"]
        (verdict,) = [event for event in events if event["kind"] == "verdict"]
        assert verdict["data"]["rewards"] == [0.123456789] * 4 and secret in verdict["data"]["reasons"]
        for client in (worker, intruder, first, second):
            await client.aclose()

    asyncio.run(scenario())


def test_a_validator_that_keeps_voting_against_the_decisions_is_shown_and_handed_less(quorum_two_url: str) -> None:
    """Three validators at quorum 2 against a real coordinator: the one that rejects what the other two accept is
    outvoted each time; /v1/stats shows its record and flags it, and its pending lists shrink."""

    async def scenario() -> None:
        url = quorum_two_url
        worker, liar, first, second = await worker_and_validators(url, 3)
        for round_number in range(4):
            (task,) = (await worker.lease(LeaseRequest())).tasks
            submission_id = (await worker.submit(submission_for(task))).submission_id
            for validator in (liar, first):
                assert [item.submission_id for item in (await validator.pending()).submissions] == [submission_id]
            if round_number < 3:  # two audits in flight are all quorum 2 needs, until the liar is flagged
                assert (await second.pending()).submissions == []
            lie = Verdict(submission_id=submission_id, accepted=False, reasons=["rollout p0/s0: proof: invented"])
            assert (await liar.post_verdict(lie)).status == "pending"
            honest = Verdict(submission_id=submission_id, accepted=True, rewards=[0.5] * len(task.prompts) * 2)
            assert (await first.post_verdict(honest)).status == "pending"
            # two votes that disagree: a third validator is handed it
            assert [item.submission_id for item in (await second.pending()).submissions] == [submission_id]
            assert (await second.post_verdict(honest)).status == "accepted"
        stats = httpx.get(f"{url}/v1/stats", params={"limit": 100}, timeout=10).json()
        record = {node["node_id"]: node for node in stats["nodes"]}
        assert (record[liar.identity.node_id]["num_votes_outvoted"], record[liar.identity.node_id]["flagged"]) == (
            4,
            True,
        )
        assert record[first.identity.node_id]["num_votes_agreed"] == 4 and not record[first.identity.node_id]["flagged"]
        for _ in range(3):  # more work waiting: the flagged validator is handed less of it
            (task,) = (await worker.lease(LeaseRequest())).tasks
            await worker.submit(submission_for(task))
        assert len((await liar.pending(limit=16)).submissions) < len((await first.pending(limit=16)).submissions)
        for client in (worker, liar, first, second):
            await client.aclose()

    asyncio.run(scenario())
