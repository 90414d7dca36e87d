"""Validators that are not to be trusted, on SQLite and PostgreSQL, through the API.

A verdict counts only on a submission the ledger handed to its validator, within the hand-out's
validity; votes (how, and with which rewards) stay private until the decision, on every public
route; and each validator's record against the decisions is kept, shown, and used: one that
keeps voting against them is flagged and handed fewer submissions.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select, update

from coordinator.ledger.storage.tables import accepted_groups, nodes, verdict_votes
from protocol.errors import ConflictError, ForbiddenError
from protocol.ledger_client import LedgerClient
from protocol.schemas import Dashboard, LeaseRequest, Verdict
from tests.support.ledger_helpers import submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio

SECRET_REASON = "toploc: chunk 3 mismatch (do-not-leak-7f3a)"
SECRET_REWARDS = [0.123456789, 0.987654321, 0.192837465, 0.918273645]


async def submitted(worker: LedgerClient) -> str:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    return (await worker.submit(submission_for(task))).submission_id


def num_votes(harness: LedgerHarness) -> int:
    with harness.database.read() as conn:
        return int(conn.execute(select(func.count()).select_from(verdict_votes)).scalar_one())


async def test_a_verdict_on_a_submission_never_handed_out_is_refused(harness: LedgerHarness) -> None:
    worker, honest, intruder = await harness.worker(), await harness.validator(), await harness.validator()
    submission_id = await submitted(worker)
    assert submission_id in {e.subject for e in (await worker.events(limit=1000)).events}  # the id is public
    with pytest.raises(ForbiddenError, match="never handed to validator"):
        await intruder.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4))
    assert num_votes(harness) == 0 and (await worker.status()).num_submissions_pending == 1  # quorum 1: nothing
    (item,) = (await honest.pending()).submissions
    answer = await honest.post_verdict(Verdict(submission_id=item.submission_id, accepted=True, rewards=[0.5] * 4))
    assert answer.status == "accepted"
    for client in (worker, honest, intruder):
        await client.aclose()


async def test_a_hand_out_is_valid_for_hand_out_ttl_s(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__hand_out_ttl_s=60.0)
    worker, validator = await harness.worker(), await harness.validator()
    submission_id = await submitted(worker)
    assert [item.submission_id for item in (await validator.pending()).submissions] == [submission_id]
    harness.clock.advance(61.0)
    with pytest.raises(ConflictError, match=r"hand-out .* lapsed .*validation\.hand_out_ttl_s"):
        await validator.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4))
    assert num_votes(harness) == 0
    assert [item.submission_id for item in (await validator.pending()).submissions] == [submission_id]  # anew
    answer = await validator.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4))
    assert answer.status == "accepted"
    await worker.aclose()
    await validator.aclose()


async def pending_ids(validator: LedgerClient) -> list[str]:
    return [item.submission_id for item in (await validator.pending()).submissions]


async def test_validators_split_the_pending_list_until_a_hand_out_goes_stale(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__hand_out_claim_s=30.0)
    worker, first, second = await harness.worker(), await harness.validator(), await harness.validator()
    submission_id = await submitted(worker)
    assert await pending_ids(first) == [submission_id]
    assert await pending_ids(second) == []  # with the first, which is all quorum 1 needs
    harness.clock.advance(20.0)
    assert await pending_ids(first) == [submission_id]  # its own hand-out does not hide it from it ...
    assert await pending_ids(second) == []
    harness.clock.advance(11.0)  # ... nor does asking again renew its claim: 31 s since it was first handed
    assert await pending_ids(second) == [submission_id]
    answer = await second.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4))
    assert answer.status == "accepted"
    for client in (worker, first, second):
        await client.aclose()


@pytest.mark.parametrize("standing", ["banned", "flagged", "unapproved"])
async def test_only_a_validator_in_good_standing_holds_a_claim(make_harness: MakeHarness, standing: str) -> None:
    harness = make_harness(validation__hand_out_claim_s=30.0)
    worker, first, second = await harness.worker(), await harness.validator(), await harness.validator()
    submission_id = await submitted(worker)
    assert await pending_ids(first) == [submission_id] and await pending_ids(second) == []
    by_standing: dict[str, dict[str, object]] = {
        "banned": {"banned": True},
        "flagged": {"num_votes_outvoted": 3, "num_votes_agreed": 1},  # 3 outvoted, 75% of its decided votes
        "unapproved": {"approved": False},
    }
    changes = by_standing[standing]
    with harness.database.write() as conn:
        conn.execute(update(nodes).where(nodes.c.node_id == first.identity.node_id).values(**changes))
    assert await pending_ids(second) == [submission_id]  # its hand-out no longer keeps it from the others
    for client in (worker, first, second):
        await client.aclose()


async def test_a_quorum_is_handed_to_as_many_validators_as_it_needs(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__hand_out_claim_s=30.0, validation__validators_per_submission=2)
    worker = await harness.worker()
    first, second, third = [await harness.validator() for _ in range(3)]
    submission_id = await submitted(worker)
    assert await pending_ids(first) == [submission_id] and await pending_ids(second) == [submission_id]
    assert await pending_ids(third) == []
    await first.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4))
    assert await pending_ids(third) == []  # the second's audit is the one vote still needed
    harness.clock.advance(31.0)  # the second went quiet: the first's vote and one more
    assert await pending_ids(third) == [submission_id]
    await third.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[0.5] * 4))
    assert await pending_ids(second) == [submission_id]  # two votes that disagree: one more is needed
    fourth = await harness.validator()
    assert await pending_ids(fourth) == [submission_id]  # the second's claim runs from its first hand-out, 31 s ago
    answer = await second.post_verdict(Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4))
    assert answer.status == "accepted"
    for client in (worker, first, second, third, fourth):
        await client.aclose()


async def public_text(harness: LedgerHarness) -> str:
    """Everything an unsigned client can read: the event log, stats, status and the dashboard's data."""
    transport = httpx.ASGITransport(app=harness.app, client=("198.51.100.9", 40000))
    async with httpx.AsyncClient(base_url="http://ledger", transport=transport) as http:
        pages = [
            await http.get(path, params=params)
            for path, params in (
                ("/v1/events", {"limit": 1000}),
                ("/v1/stats", {"limit": 1000}),
                ("/v1/status", {}),
                ("/v1/dashboard", {}),
            )
        ]
    assert all(page.status_code == 200 for page in pages)
    return "\n".join(page.text for page in pages)


async def dashboard(harness: LedgerHarness) -> Dashboard:
    transport = httpx.ASGITransport(app=harness.app, client=("198.51.100.9", 40000))
    async with httpx.AsyncClient(base_url="http://ledger", transport=transport) as http:
        return Dashboard.model_validate_json((await http.get("/v1/dashboard")).content)


async def test_votes_stay_private_until_the_quorum_decides(make_harness: MakeHarness) -> None:
    harness = make_harness(validation__validators_per_submission=2)
    worker = await harness.worker()
    first, second, lazy = [await harness.validator() for _ in range(3)]
    submission_id = await submitted(worker)
    for validator in (first, second, lazy):
        await validator.pending()
    verdict = Verdict(submission_id=submission_id, accepted=True, rewards=SECRET_REWARDS, reasons=[SECRET_REASON])
    assert (await first.post_verdict(verdict)).status == "pending"
    text = await public_text(harness)
    for secret in (SECRET_REASON, *(repr(r) for r in SECRET_REWARDS)):
        assert secret not in text, f"{secret!r} is public before the quorum"
    (vote,) = [e for e in (await lazy.events(limit=1000)).events if e.kind == "vote"]
    assert vote.node_id == first.identity.node_id and set(vote.data) == {"worker_id"}  # that it voted, not how
    assert (await second.post_verdict(verdict)).status == "accepted"
    text = await public_text(harness)
    assert SECRET_REASON in text and repr(SECRET_REWARDS[0]) in text  # decided: the verdict is public
    for client in (worker, first, second, lazy):
        await client.aclose()


async def test_a_validator_that_keeps_voting_against_the_decisions_is_flagged(make_harness: MakeHarness) -> None:
    harness = make_harness(
        validation__validators_per_submission=2,
        validation__flag_after_outvoted=3,
        validation__max_outvoted_fraction=0.2,
        validation__flagged_hand_outs=1,
        validation__hand_out_claim_s=0.0,  # every validator is handed every submission
        scheduling__max_leases_per_node=8,
    )
    workers = [await harness.worker() for _ in range(4)]
    honest = [await harness.validator() for _ in range(2)]
    liar = await harness.validator()
    for round_number in range(4):
        submission_ids = [await submitted(worker) for worker in workers[round_number % 2 :: 2]]
        pending = {v.identity.node_id: (await v.pending(limit=16)).submissions for v in (liar, *honest)}
        for submission_id in submission_ids:
            if any(item.submission_id == submission_id for item in pending[liar.identity.node_id]):
                lie = Verdict(submission_id=submission_id, accepted=False, reasons=["liar: forged"])
                assert (await liar.post_verdict(lie)).status == "pending"
            for validator in honest:
                truth = Verdict(submission_id=submission_id, accepted=True, rewards=[1.0] * 4)
                await validator.post_verdict(truth)
    with harness.database.read() as conn:
        assert conn.execute(select(func.count()).select_from(accepted_groups)).scalar_one() == 8  # safety held
    stats = {node.node_id: node for node in (await liar.stats(limit=100)).nodes}
    record = stats[liar.identity.node_id]
    # Two rounds of two lies flag it (4 outvoted >= 3, all of its votes); then it gets one per round.
    assert (record.num_votes_agreed, record.num_votes_outvoted, record.flagged) == (0, 6, True), record
    for validator in honest:
        node = stats[validator.identity.node_id]
        assert (node.num_votes_agreed, node.num_votes_outvoted, node.flagged) == (8, 0, False), node
    shown = {node.node_id: node for node in (await dashboard(harness)).nodes}[liar.identity.node_id]
    assert (shown.num_votes_agreed, shown.num_votes_outvoted, shown.flagged) == (0, 6, True)
    # Its allotment: one submission per pending list, while the others get all of them.
    for worker in workers:
        await submitted(worker)
    assert len((await liar.pending(limit=16)).submissions) == 1
    assert len((await honest[0].pending(limit=16)).submissions) == 4
    for client in (*workers, *honest, liar):
        await client.aclose()
