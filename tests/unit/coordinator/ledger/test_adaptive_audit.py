"""Adaptive audit on SQLite and PostgreSQL: the share of a submission recomputed follows its worker's record,
a rejection starts the record over and loses the worker's credit, trusted nodes are audited at their floor,
and the policy is signed into the run spec; the policy's probabilities and its cheating bound."""

from __future__ import annotations

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.ledger.audit_policy import audit_policy, audit_share, cheat_bound, ramp_submissions
from protocol.ledger_client import LedgerClient
from protocol.schemas import AuditPolicy, LeaseRequest, Verdict
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import MakeHarness

ADAPTIVE = AuditPolicy(adaptive=True, full_audit_results=10, floor=0.05, trusted_floor=0.02)


def test_the_share_is_whole_until_the_record_then_one_over_it_down_to_the_floor() -> None:
    assert [audit_share(ADAPTIVE, record) for record in (0, 1, 9)] == [1.0, 1.0, 1.0]
    assert audit_share(ADAPTIVE, 10) == pytest.approx(0.1)
    assert audit_share(ADAPTIVE, 16) == pytest.approx(1 / 16)
    assert audit_share(ADAPTIVE, 20) == audit_share(ADAPTIVE, 10_000) == 0.05
    assert audit_share(ADAPTIVE, 0, trusted=True) == 0.02  # the operator's own machines skip the ramp
    assert audit_share(AuditPolicy(fixed_share=0.25), 10_000) == 0.25  # not adaptive: the fixed share
    assert ramp_submissions(ADAPTIVE) == 20


def test_the_bound_takes_the_cheater_s_best_strategy_and_shrinks_with_the_floor() -> None:
    bound = cheat_bound(ADAPTIVE, samples_per_submission=8, detection_power=1.0)
    assert bound.audited_at_floor == 1
    # c cheated of 8, one recomputed: caught with c/8; the accepted cheating submissions before it, (8 - c) / c,
    # carry c cheated samples each, against 8 per submission plus 20 honest submissions of 8 to rebuild.
    shares = {c: c * ((8 - c) / c) / (8 * ((8 - c) / c) + 160) for c in range(1, 9)}
    assert bound.cheated_per_submission == max(shares, key=lambda c: shares[c])
    assert bound.cheated_fraction == pytest.approx(max(shares.values()))
    assert 0.01 < bound.cheated_fraction < 0.05
    weaker = cheat_bound(ADAPTIVE, 8, detection_power=0.5)
    stricter = cheat_bound(ADAPTIVE.model_copy(update={"floor": 0.25}), 8, 1.0)
    assert weaker.cheated_fraction > bound.cheated_fraction > stricter.cheated_fraction
    assert cheat_bound(AuditPolicy(), 8, 1.0).cheated_fraction == 0.0  # every sample recomputed, caught
    assert bound.deterrent_share == pytest.approx(1 / 161)
    assert bound.deterrent_share < 1 / 8  # one sample of 8 recomputed: cheating a sample does not pay here
    with pytest.raises(ValueError, match="detection power"):
        cheat_bound(ADAPTIVE, 8, 0.0)


def test_the_policy_is_signed_into_the_run_spec() -> None:
    from coordinator.ledger.run_spec import run_spec

    trusted = "1" * 44
    config = CoordinatorConfig.model_validate(
        {"validation": {"adaptive": {"enabled": True, "floor": 0.1, "trusted_nodes": [trusted, trusted]}}}
    )
    assert run_spec(config).audit == audit_policy(config.validation)
    assert run_spec(config).audit.model_dump(exclude={"v"}) == {
        "adaptive": True,
        "fixed_share": 1.0,
        "full_audit_results": 10,
        "floor": 0.1,
        "trusted_floor": 0.05,
        "trusted_nodes": [trusted],
        "reaudit_share": 0.05,
    }


async def _submitted(worker: LedgerClient) -> str:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    return (await worker.submit(submission_for(task))).submission_id


async def _judged(worker: LedgerClient, validator: LedgerClient, accept: bool) -> int:
    """Lease, submit and judge one task; how many of its samples the validator was asked to recompute."""
    submission_id = await _submitted(worker)
    (item,) = [i for i in (await validator.pending()).submissions if i.submission_id == submission_id]
    reasons = [] if accept else ["proof: rollout p0/s0 does not match"]
    await validator.post_verdict(Verdict(submission_id=submission_id, accepted=accept, reasons=reasons))
    return len(item.audit_sample_indices)


@pytest.mark.anyio
async def test_the_recomputed_share_follows_the_record_and_a_rejection_loses_the_credit(
    make_harness: MakeHarness,
) -> None:
    harness = make_harness(
        scheduling__group_size=8,  # 2 prompts x 8 samples = 16 per submission
        validation__adaptive__enabled=True,
        validation__adaptive__full_audit_results=2,
        validation__adaptive__floor=0.1,
    )
    worker, validator = await harness.worker(), await harness.validator()
    counts = [await _judged(worker, validator, accept=True) for _ in range(5)]
    assert counts == [16, 16, 8, 6, 4]  # whole, whole, then 1/2, 1/3, 1/4 of 16 (rounded up)
    mine = {node.node_id: node for node in (await worker.stats()).nodes}[worker.identity.node_id]
    assert mine.credit_samples == 5 * 16 and mine.credit_tokens > 0 and mine.credit_lost_samples == 0
    earned = mine.credit_tokens

    assert await _judged(worker, validator, accept=False) == 4
    assert await _judged(worker, validator, accept=True) == 16  # the record starts over
    mine = {node.node_id: node for node in (await worker.stats()).nodes}[worker.identity.node_id]
    assert (mine.credit_lost_samples, mine.credit_lost_tokens) == (5 * 16, earned)
    assert mine.credit_samples == 16
    await worker.aclose()
    await validator.aclose()


@pytest.mark.anyio
async def test_trusted_nodes_are_audited_at_their_floor_from_the_start(make_harness: MakeHarness) -> None:
    from protocol.identity import NodeIdentity
    from tests.support.ledger_helpers import register_request

    identity = NodeIdentity.generate()
    harness = make_harness(
        scheduling__group_size=8,
        validation__adaptive__enabled=True,
        validation__adaptive__trusted_nodes=[identity.node_id],
        validation__adaptive__trusted_floor=0.125,
    )
    trusted = harness.client(identity=identity)
    await trusted.register(register_request("worker"))
    untrusted, validator = await harness.worker(), await harness.validator()
    assert await _judged(trusted, validator, accept=True) == 2  # 1/8 of 16 from the first submission
    assert await _judged(untrusted, validator, accept=True) == 16
    for client in (trusted, untrusted, validator):
        await client.aclose()


@pytest.mark.anyio
async def test_a_failed_reaudit_catches_the_worker_after_the_fact(make_harness: MakeHarness) -> None:
    from sqlalchemy import insert, select

    from coordinator.ledger.storage.tables import accepted_groups, step_submissions, submissions, train_steps

    harness = make_harness(
        scheduling__group_size=8,
        validation__adaptive__enabled=True,
        validation__adaptive__full_audit_results=2,
        validation__adaptive__floor=0.1,
        validation__adaptive__reaudit_share=1.0,  # every accepted submission with unchecked samples
        trust__ban_after_rejections=5,
    )
    worker, validator = await harness.worker(), await harness.validator()
    ids = []
    for _ in range(4):  # shares 1, 1, 1/2, 1/3: the last two leave samples nobody recomputed
        ids.append(await _submitted(worker))
        (item,) = [i for i in (await validator.pending()).submissions if i.submission_id == ids[-1]]
        assert not item.reaudit
        await validator.post_verdict(Verdict(submission_id=ids[-1], accepted=True))
    first_check = harness.ledger.audit_indices(ids[2], 16, 0.5)
    again = {i.submission_id: i for i in (await validator.pending()).submissions if i.reaudit}
    assert sorted(again) == sorted(ids[2:])  # the same validator may audit again: other samples
    assert sorted(again[ids[2]].audit_sample_indices) == sorted(set(range(16)) - set(first_check))
    response = await validator.post_verdict(Verdict(submission_id=ids[2], accepted=True))
    assert response.status == "accepted"
    assert [i.submission_id for i in (await validator.pending()).submissions if i.reaudit] == [ids[3]]

    with harness.database.write() as conn:  # ids[2] is in a training step; ids[3] is not trained yet
        conn.execute(insert(train_steps).values(step=1, state="trained", min_policy_version=0, recorded_at=0.0))
        conn.execute(insert(step_submissions).values(submission_id=ids[2], step=1, position=0))
    later = await _submitted(worker)  # pending when the worker is caught: to be recomputed whole
    mine = {n.node_id: n for n in (await worker.stats()).nodes}[worker.identity.node_id]
    assert mine.credit_samples == 4 * 16

    caught = await validator.post_verdict(
        Verdict(submission_id=ids[3], accepted=False, reasons=["proof: rollout p1/s3 does not match"])
    )
    assert caught.status == "rejected"
    with harness.database.read() as conn:
        status = dict(conn.execute(select(submissions.c.submission_id, submissions.c.status)).all())
        in_training = set(conn.execute(select(accepted_groups.c.submission_id)).scalars())
    assert status[ids[3]] == "rejected" and ids[3] not in in_training  # caught: out of training, its task re-opened
    assert status[ids[2]] == "accepted" and ids[2] in in_training  # trained already: stays
    mine = {n.node_id: n for n in (await worker.stats()).nodes}[worker.identity.node_id]
    assert (mine.credit_samples, mine.credit_lost_samples, mine.num_rejected) == (0, 4 * 16, 1)
    (pending,) = [i for i in (await validator.pending()).submissions if i.submission_id == later]
    assert len(pending.audit_sample_indices) == 16 and not pending.reaudit
    events = [e for e in (await validator.events(after=0, limit=1000)).events if e.kind == "reaudit"]
    assert [(e.subject, e.data["passed"]) for e in events] == [(ids[2], True), (ids[3], False)]
    await worker.aclose()
    await validator.aclose()


@pytest.mark.anyio
async def test_a_reaudit_the_environment_cannot_score_judges_nobody(make_harness: MakeHarness) -> None:
    harness = make_harness(
        scheduling__group_size=8,
        validation__adaptive__enabled=True,
        validation__adaptive__full_audit_results=1,
        validation__adaptive__floor=0.1,
        validation__adaptive__reaudit_share=1.0,
    )
    worker, validator = await harness.worker(), await harness.validator()
    ids = []
    for _ in range(3):  # shares 1, 1, 1/2
        ids.append(await _submitted(worker))
        await validator.pending()
        await validator.post_verdict(Verdict(submission_id=ids[-1], accepted=True))
    (again,) = [i for i in (await validator.pending()).submissions if i.reaudit]
    failure = "environment: scoring rollout p0/s0 failed: ValueError"
    unscored = Verdict(submission_id=again.submission_id, accepted=False, reasons=[failure], environment_error=failure)
    assert (await validator.post_verdict(unscored)).status == "accepted"
    mine = {n.node_id: n for n in (await worker.stats()).nodes}[worker.identity.node_id]
    assert (mine.num_rejected, mine.credit_lost_samples, mine.credit_samples) == (0, 0, 3 * 16)
    assert not [i for i in (await validator.pending()).submissions if i.reaudit]
    await worker.aclose()
    await validator.aclose()
