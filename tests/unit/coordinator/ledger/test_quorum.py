"""Validators' verdicts on SQLite and PostgreSQL: audited samples, quorum of agreeing votes, decisions once.

With ``validation.validators_per_submission`` = N, each validator's verdict is a vote; only
N agreeing votes decide a submission, and only then do the accepted set, the worker's
reputation and bans change. A validator never sees a submission it judged again and cannot
vote twice.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import delete, func, select

from coordinator.ledger.storage import migrations
from coordinator.ledger.storage.tables import accepted_groups, schema_version, verdict_votes
from protocol.errors import ConflictError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, Verdict
from tests.support.ledger_helpers import register_request, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio


async def submitted(worker: LedgerClient) -> str:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    return (await worker.submit(submission_for(task))).submission_id


def num_accepted_groups(harness: LedgerHarness) -> int:
    with harness.database.read() as conn:
        return int(conn.execute(select(func.count()).select_from(accepted_groups)).scalar_one())


async def test_pending_lists_the_samples_the_ledger_chose(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__audit_fraction=0.25, scheduling__group_size=8)
    worker, validator = await harness.worker(), await harness.validator()
    ids = [await submitted(worker) for _ in range(2)]
    found = {item.submission_id: item for item in (await validator.pending()).submissions}
    for submission_id in ids:
        item = found[submission_id]
        assert len(item.submission.rollouts) == 16
        assert len(item.audit_sample_indices) == 4
        assert item.audit_sample_indices == harness.ledger.audit_indices(submission_id, 16)
    again = {item.submission_id: item.audit_sample_indices for item in (await validator.pending()).submissions}
    assert again == {sid: found[sid].audit_sample_indices for sid in ids}  # stable across calls
    await worker.aclose()
    await validator.aclose()


async def test_default_audits_every_sample(harness: LedgerHarness, worker: LedgerClient) -> None:
    await submitted(worker)
    validator = await harness.validator()
    (item,) = (await validator.pending()).submissions
    assert item.audit_sample_indices == list(range(len(item.submission.rollouts)))
    await validator.aclose()


async def test_two_agreeing_validators_accept_and_nothing_changes_before(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__validators_per_submission=2)
    worker = await harness.worker()
    first, second = await harness.validator(), await harness.validator()
    submission_id = await submitted(worker)
    rewards = [0.5, 1.0, 0.0, 0.25]
    await first.pending()
    answer = await first.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=rewards))
    assert answer.status == "pending"
    assert num_accepted_groups(harness) == 0 and (await worker.status()).num_submissions_pending == 1
    assert (await first.pending()).submissions == []  # never shown again to the validator that judged it
    assert [item.submission_id for item in (await second.pending()).submissions] == [submission_id]
    again = await first.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=rewards))
    assert again.status == "pending"  # the same validator twice is one vote
    with pytest.raises(ConflictError, match="already accepted"):
        await first.post_verdict(Verdict(submission_id=submission_id, accepted=False, reasons=["changed my mind"]))
    near = [r + 1e-9 for r in rewards]
    decided = await second.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=near))
    assert decided.status == "accepted"
    assert num_accepted_groups(harness) == 1
    stats = {node.node_id: node for node in (await worker.stats()).nodes}
    assert stats[worker.identity.node_id].num_accepted == 1
    (event,) = [e for e in (await worker.events(limit=1000)).events if e.kind == "verdict"]
    assert event.data["rewards"] == rewards
    assert sorted(str(v) for v in event.data["validators"]) == sorted([first.identity.node_id, second.identity.node_id])  # type: ignore[attr-defined]
    assert [e.kind for e in (await worker.events(limit=1000)).events].count("vote") == 2
    for client in (worker, first, second):
        await client.aclose()


async def test_disagreeing_rewards_are_not_agreement(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__validators_per_submission=2, validation__hand_out_claim_s=0.0)
    worker = await harness.worker()
    validators = [await harness.validator() for _ in range(3)]
    submission_id = await submitted(worker)
    honest = [1.0, 0.0, 1.0, 0.0]
    inflated = [1.0, 1.0, 1.0, 1.0]
    for validator in validators:
        await validator.pending()
    assert (
        await validators[0].post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=honest))
    ).status == "pending"
    assert (
        await validators[1].post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=inflated))
    ).status == "pending"
    assert num_accepted_groups(harness) == 0
    third = await validators[2].post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=honest))
    assert third.status == "accepted"
    (event,) = [e for e in (await worker.events(limit=1000)).events if e.kind == "verdict"]
    assert event.data["rewards"] == honest
    for client in (worker, *validators):
        await client.aclose()


async def test_reputation_and_bans_change_only_on_the_final_rejection(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__validators_per_submission=2, trust__ban_after_rejections=1)
    worker = await harness.worker()
    first, second = await harness.validator(), await harness.validator()
    submission_id = await submitted(worker)
    await first.pending()
    await second.pending()
    one = await first.post_verdict(Verdict(submission_id=submission_id, accepted=False, reasons=["toploc: mismatch"]))
    assert (one.status, one.worker_banned) == ("pending", False)
    stats = {node.node_id: node for node in (await worker.stats()).nodes}
    assert stats[worker.identity.node_id].num_rejected == 0
    await worker.lease(LeaseRequest())  # not banned yet
    two = await second.post_verdict(Verdict(submission_id=submission_id, accepted=False, reasons=["sampling: off"]))
    assert (two.status, two.worker_banned) == ("rejected", True)
    (event,) = [e for e in (await worker.events(limit=1000)).events if e.kind == "verdict"]
    assert event.data["reasons"] == ["toploc: mismatch", "sampling: off"]
    assert num_accepted_groups(harness) == 0
    for client in (worker, first, second):
        await client.aclose()


async def test_a_late_vote_after_the_decision_changes_nothing(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__hand_out_claim_s=0.0)  # every validator is handed it
    worker = await harness.worker()
    first, late = await harness.validator(), await harness.validator()
    submission_id = await submitted(worker)
    await first.pending()
    await late.pending()
    assert (await first.post_verdict(Verdict(submission_id=submission_id, accepted=True))).status == "accepted"
    answer = await late.post_verdict(Verdict(submission_id=submission_id, accepted=False, reasons=["late"]))
    assert (answer.status, answer.worker_banned) == ("accepted", False)
    with harness.database.read() as conn:
        assert conn.execute(select(func.count()).select_from(verdict_votes)).scalar_one() == 1
    stats = {node.node_id: node for node in (await worker.stats()).nodes}
    assert (stats[worker.identity.node_id].num_accepted, stats[worker.identity.node_id].num_rejected) == (1, 0)
    for client in (worker, first, late):
        await client.aclose()


async def test_a_ledger_upgraded_from_v3_decides_its_pending_submissions(make_harness: MakeHarness) -> None:
    old = make_harness()
    worker = await old.worker()
    submission_id = await submitted(worker)
    with old.database.write() as conn:  # back to the schema before votes (v3), a submission pending
        for table in ("prompt_signal", "no_signal_groups"):  # v11's
            conn.exec_driver_sql(f"DROP TABLE {table}")
        for column in ("kind", "attempt", "restore_version", "rolled_back", "trips_json"):
            conn.exec_driver_sql(f"ALTER TABLE train_steps DROP COLUMN {column}")
        for column in ("rollback_json", "version_floor"):
            conn.exec_driver_sql(f"ALTER TABLE run_state DROP COLUMN {column}")
        conn.exec_driver_sql("DROP TABLE api_processes")  # v10's
        for column in ("run_spec_json", "api_settings_json"):
            conn.exec_driver_sql(f"ALTER TABLE run_state DROP COLUMN {column}")
        conn.exec_driver_sql("DROP TABLE reaudits")  # v9's
        conn.exec_driver_sql("DROP TABLE audit_records")
        conn.exec_driver_sql("ALTER TABLE submissions DROP COLUMN audit_share")
        for column in ("credit_samples", "credit_tokens", "credit_lost_samples", "credit_lost_tokens"):
            conn.exec_driver_sql(f"ALTER TABLE nodes DROP COLUMN {column}")
        conn.exec_driver_sql("DROP INDEX leases_source")  # v6's
        for column in ("source", "probation"):
            conn.exec_driver_sql(f"ALTER TABLE leases DROP COLUMN {column}")
        for table in ("step_submissions", "train_steps", "verdict_votes"):  # v5's, then v4's
            conn.exec_driver_sql(f"DROP TABLE {table}")
        conn.exec_driver_sql("DROP TABLE validator_approvals")  # v8's
        conn.exec_driver_sql("DROP INDEX leases_task")  # v7's
        conn.exec_driver_sql("DROP TABLE hand_outs")
        conn.exec_driver_sql("ALTER TABLE leases DROP COLUMN end_reason")
        for column in ("num_votes_agreed", "num_votes_outvoted", "num_forfeited"):
            conn.exec_driver_sql(f"ALTER TABLE nodes DROP COLUMN {column}")
        conn.execute(delete(schema_version).where(schema_version.c.version >= 4))
    upgraded = make_harness()  # opening the ledger migrates v3 -> latest
    with upgraded.database.read() as conn:
        assert migrations.current_version(conn) == migrations.LATEST_VERSION
    validator = await upgraded.validator()
    (item,) = (await validator.pending()).submissions
    assert item.submission_id == submission_id
    assert (await validator.post_verdict(Verdict(submission_id=submission_id, accepted=True))).status == "accepted"
    assert num_accepted_groups(upgraded) == 1
    await worker.aclose()
    await validator.aclose()


async def test_concurrent_votes_decide_once(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__validators_per_submission=2, validation__hand_out_claim_s=0.0)
    worker = await harness.worker()
    submission_id = await submitted(worker)
    validator_ids = []
    for _ in range(4):
        identity = NodeIdentity.generate()
        harness.ledger.register(identity.node_id, "127.0.0.1", register_request("validator"))
        validator_ids.append(identity.node_id)
        harness.ledger.pending(identity.node_id, 16)
    verdict = Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4)
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda node_id: harness.ledger.post_verdict(node_id, verdict), validator_ids))
    assert [answer.status for answer in answers].count("accepted") >= 1
    kinds = [event.kind for event in (await worker.events(limit=1000)).events]
    assert kinds.count("verdict") == 1 and num_accepted_groups(harness) == 1
    assert kinds.count("vote") == 2  # votes that arrive after the decision are not recorded
    stats = {node.node_id: node for node in (await worker.stats()).nodes}
    assert stats[worker.identity.node_id].num_accepted == 1
    await worker.aclose()
