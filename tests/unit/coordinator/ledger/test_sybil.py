"""Sybil limits of the ledger on SQLite and PostgreSQL, through the API from distinct client addresses.

Keys minted on one source share its probation budget and its fair share of open leases, so an
honest worker from another source still gets work; an identity earns more leases with accepted
work and loses them with rejections; registrations are capped per address and per prefix; and
``X-Forwarded-For`` names the client only when a trusted proxy sends it.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from coordinator.ledger.storage.tables import nodes
from protocol.errors import ConflictError, RateLimitedError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, Task, Verdict
from tests.support.ledger_helpers import register_request, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio

SYBIL_ADDRESSES = [f"203.0.113.{host}" for host in range(1, 21)]  # one /24: one source


async def lease_all(workers: list[LedgerClient], max_tasks: int = 2) -> list[Task]:
    return [task for worker in workers for task in (await worker.lease(LeaseRequest(max_tasks=max_tasks))).tasks]


async def close(*clients: LedgerClient) -> None:
    for client in clients:
        await client.aclose()


async def test_keys_from_one_source_share_one_probation_budget(make_harness: MakeHarness) -> None:
    harness = make_harness(
        sources__allow=[],
        sources__probation_budget=3,
        sources__probation_share=1.0,  # the network-wide pool does not bind here (see test_probation_pool)
        scheduling__max_open_leases=8,
    )
    sybils = [await harness.worker(address) for address in SYBIL_ADDRESSES]
    assert len(await lease_all(sybils)) == 3  # 20 keys, one budget
    assert len(await lease_all(sybils)) == 0
    honest = [await harness.worker("198.51.100.7"), await harness.worker("192.0.2.1")]
    assert [len(t) for t in [await lease_all([w]) for w in honest]] == [1, 1]  # each new identity: its allowance
    await close(*sybils, *honest)


async def test_fair_share_is_across_sources_not_keys(make_harness: MakeHarness) -> None:
    harness = make_harness(
        sources__allow=[],
        sources__proven_after_accepted=0,  # nobody on probation: only the fair share binds
        sources__new_identity_leases=2,
        scheduling__max_open_leases=4,
    )
    many = [await harness.worker(address) for address in SYBIL_ADDRESSES[:10]]
    one = await harness.worker("198.51.100.7")
    assert len(await lease_all(many)) == 2  # 4 slots over 2 live sources
    assert len(await lease_all([one])) == 2  # one key from another source: the other half
    await close(*many, one)


async def test_allow_listed_keys_are_sources_of_their_own(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=["127.0.0.0/8"], sources__probation_budget=1)
    trusted = [await harness.worker("127.0.0.1") for _ in range(3)]
    assert len(await lease_all(trusted)) == 6  # the per-node cap each, no budget, no probation
    await close(*trusted)


async def verdict(validator: LedgerClient, worker: LedgerClient, accepted: bool) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    submission_id = (await worker.submit(submission_for(task))).submission_id
    await validator.pending(limit=256)
    answer = await validator.post_verdict(Verdict(submission_id=submission_id, accepted=accepted, reasons=["test"]))
    assert answer.status == ("accepted" if accepted else "rejected")


async def test_unverified_work_counts_until_a_verdict_and_allowance_is_earned(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=[], sources__probation_budget=2, scheduling__max_leases_per_node=4)
    worker, validator = await harness.worker("198.51.100.7"), await harness.validator()
    submission_ids = []
    for _ in range(2):  # a new identity: one lease at a time, and its pending submissions use the budget
        (task,) = (await worker.lease(LeaseRequest(max_tasks=4))).tasks
        submission_ids.append((await worker.submit(submission_for(task))).submission_id)
    assert (await worker.lease(LeaseRequest(max_tasks=4))).tasks == []  # two awaiting a verdict: budget spent
    await validator.pending(limit=256)
    for submission_id in submission_ids:
        await validator.post_verdict(Verdict(submission_id=submission_id, accepted=True))
    held = (await worker.lease(LeaseRequest(max_tasks=4))).tasks
    assert len(held) == 3  # proven (2 accepted): 1 + 2 earned, the budget no longer applies
    rejected = (await worker.submit(submission_for(held[0]))).submission_id
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=rejected, accepted=False, reasons=["test"]))
    assert (await worker.lease(LeaseRequest(max_tasks=4))).tasks == []  # a rejection: 1 + 2 - 1, both held
    for task in held[1:]:
        await worker.abandon(task.lease_id)
    assert len((await worker.lease(LeaseRequest(max_tasks=4))).tasks) == 1  # two abandoned: 1 + 2 - 1 - 2, >= 1
    await close(worker, validator)


async def test_registrations_are_capped_per_address_and_per_prefix(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=["127.0.0.0/8"], sources__register_burst=3, sources__prefix_register_burst=5)
    for _ in range(3):
        await harness.worker("203.0.113.1")
    with pytest.raises(RateLimitedError, match=r"too many registrations from 203\.0\.113\.1"):
        await harness.worker("203.0.113.1")
    for _ in range(2):
        await harness.worker("203.0.113.2")  # another address of the same /24: the prefix's last two
    with pytest.raises(RateLimitedError, match=r"sources\.allow"):
        await harness.worker("203.0.113.3")
    await harness.worker("198.51.100.1")  # another prefix
    for _ in range(20):
        await harness.worker("127.0.0.1")  # allow-listed


def registered_ip(harness: LedgerHarness, node_id: str) -> str:
    with harness.database.read() as conn:
        return str(conn.execute(select(nodes.c.ip).where(nodes.c.node_id == node_id)).scalar_one())


async def register_via(harness: LedgerHarness, peer: str, forwarded_for: str) -> str:
    transport = httpx.ASGITransport(app=harness.app, client=(peer, 40000))
    async with httpx.AsyncClient(
        base_url="http://ledger", transport=transport, headers={"X-Forwarded-For": forwarded_for}
    ) as http:
        client = LedgerClient("http://ledger", NodeIdentity.generate(), client=http)
        await client.register(register_request())
        return registered_ip(harness, client.identity.node_id)


async def test_forwarded_for_names_the_client_only_from_a_trusted_proxy(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=[], sources__trusted_proxies=["10.0.0.0/30"])
    assert await register_via(harness, "10.0.0.1", "203.0.113.9") == "203.0.113.9"
    assert await register_via(harness, "10.0.0.2", "192.0.2.8, 10.0.0.1") == "192.0.2.8"  # proxies chained
    assert await register_via(harness, "198.51.100.4", "192.0.2.77") == "198.51.100.4"  # anyone else: ignored
    untrusting = make_harness(sources__allow=[])
    assert await register_via(untrusting, "127.0.0.1", "192.0.2.77") == "127.0.0.1"  # off by default


def many_sources(count: int) -> list[str]:
    """One address from each of ``count`` distinct /24 networks (203.0.0.1, 203.0.1.1, ...)."""
    return [f"203.0.{prefix}.1" for prefix in range(count)]


async def proven_worker(harness: LedgerHarness, address: str) -> LedgerClient:
    """A worker whose first submission was accepted: out of probation."""
    worker, validator = await harness.worker(address), await harness.validator()
    await verdict(validator, worker, accepted=True)
    await validator.aclose()
    return worker


async def test_probation_identities_of_every_source_share_one_bounded_pool(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=[], scheduling__max_open_leases=16, sources__probation_share=0.25)
    proven = await proven_worker(harness, "192.0.2.1")  # one accepted submission ends probation
    sybils = [await harness.worker(address) for address in many_sources(12)]  # 12 networks, fresh keys
    assert len(await lease_all(sybils)) == 4  # the pool: a quarter of 16, whatever the number of networks
    assert len(await lease_all(sybils)) == 0
    assert len(await lease_all([proven], max_tasks=2)) == 2  # the rest of the room is for verified work
    await close(proven, *sybils)


async def test_a_probation_lease_lives_at_most_probation_lease_max_s(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=[], sources__probation_lease_max_s=30.0, scheduling__lease_ttl_s=120.0)
    newcomer = await harness.worker("198.51.100.7")
    (task,) = (await newcomer.lease(LeaseRequest())).tasks
    assert task.deadline == pytest.approx(harness.clock() + 30.0)
    harness.clock.advance(20.0)
    assert (await newcomer.renew(task.lease_id)).deadline == pytest.approx(harness.clock() + 10.0)  # not beyond
    harness.clock.advance(10.0)
    with pytest.raises(ConflictError, match=r"on probation lives at most 30 s \(sources\.probation_lease_max_s\)"):
        await newcomer.renew(task.lease_id)
    assert (await newcomer.submit(submission_for(task))).status == "pending"  # submitting is still fine
    await close(newcomer)


async def test_hoarding_costs_the_source_and_the_pool_turns_over_to_newcomers(make_harness: MakeHarness) -> None:
    harness = make_harness(
        sources__allow=[],
        scheduling__max_open_leases=16,
        sources__probation_share=0.5,  # a pool of 8
        sources__probation_lease_max_s=30.0,
    )
    hoarders = [await harness.worker(address) for address in many_sources(8)]
    assert len(await lease_all(hoarders)) == 8  # the pool, full of leases that will never be submitted
    newcomer = await harness.worker("198.51.100.7")
    assert await lease_all([newcomer]) == []  # full: it waits ...
    harness.clock.advance(31.0)  # ... at most probation_lease_max_s: the hoarded leases expire
    assert len(await lease_all([newcomer])) == 1  # first in: its source never forfeited
    assert len(await lease_all(hoarders)) == 3  # hoarders may only refill the pool to half (4 of 8)
    assert await lease_all(hoarders) == []
    late = await harness.worker("198.51.200.9")
    assert len(await lease_all([late])) == 1  # the other half stays open to sources without a forfeit
    with harness.database.read() as conn:
        forfeited = conn.execute(select(nodes.c.num_forfeited).where(nodes.c.ip.like("203.0.%"))).scalars().all()
    assert sorted(forfeited) == [1] * 8  # each hoarder's expired lease costs it allowance
    await close(*hoarders, newcomer, late)


async def test_an_honest_newcomers_first_accepted_submission_ends_probation(make_harness: MakeHarness) -> None:
    harness = make_harness(sources__allow=[], scheduling__max_leases_per_node=4, scheduling__max_open_leases=16)
    sybils = [await harness.worker(address) for address in many_sources(16)]
    await lease_all(sybils)  # the probation pool is full
    harness.clock.advance(harness.config.sources.probation_lease_max_s + 1)
    honest, validator = await harness.worker("198.51.100.7"), await harness.validator()
    (first,) = (await honest.lease(LeaseRequest(max_tasks=4))).tasks  # a newcomer: one at a time
    submission_id = (await honest.submit(submission_for(first))).submission_id
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=submission_id, accepted=True))
    leased = (await honest.lease(LeaseRequest(max_tasks=4))).tasks
    assert len(leased) == 2  # proven: 1 + 1 earned, from the room the probation pool cannot take
    assert all(
        task.deadline == pytest.approx(harness.clock() + harness.config.scheduling.lease_ttl_s) for task in leased
    )
    await close(*sybils, honest, validator)
