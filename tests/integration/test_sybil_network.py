"""A Sybil flood against a real `prime-coordinator start`: many keys from one source, honest workers from others.

Every client binds its own loopback address (all of 127.0.0.0/8 is loopback on Linux), so the
coordinator sees distinct sources: the Sybil's keys come from 127.0.0.1-8 (one /24), the
honest workers from 127.1.0.1 and 127.2.0.1. The Sybil registers far more keys than the
per-address and per-prefix caps admit, forged ``X-Forwarded-For`` headers change nothing (no
trusted proxy is configured), and the keys it did register hoard every lease they can get;
the honest workers still get work, because the Sybil's keys share one probation budget. A
second flood comes from many /24 networks at once: the keys of every network together fit in
the probation pool, it turns over, and an honest newcomer's first accepted group lifts it out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest
import tomli_w

from protocol.errors import RateLimitedError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, Verdict
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import register_request, submission_for
from tests.support.network import REPO_ROOT

SYBIL_ADDRESSES = [f"127.0.0.{host}" for host in range(1, 9)]
HONEST_ADDRESSES = ["127.1.0.1", "127.2.0.1"]
SYBIL_KEYS_PER_ADDRESS = 25  # 200 keys: more than the 16 per address and 64 per prefix the defaults admit
PROBATION_BUDGET = 4  # the default


def client_from(url: str, address: str, headers: dict[str, str] | None = None) -> LedgerClient:
    """A ledger client whose connections leave from ``address``."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    http = httpx.AsyncClient(base_url=url, transport=transport, headers=headers, timeout=30)
    return LedgerClient(url, NodeIdentity.generate(), client=http)


def start_coordinator(tmp_path: Path, sources: Mapping[str, object], **sections: Mapping[str, object]) -> Iterator[str]:
    """A `prime-coordinator start` on a free port with a small config; its URL while it runs."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "sybil",
        "data_dir": str(tmp_path / "run"),
        "api": {"host": "127.0.0.1", "port": port, "maintenance_interval_s": 0.5},
        "scheduling": {"prompts_per_task": 2, "group_size": 2, "max_tokens": 8, "max_open_leases": 32},
        "trust": {"validators_open": True},
        "sources": dict(sources),
        **{name: dict(values) for name, values in sections.items()},
    }  # sources: the defaults (no allow-list, no trusted proxy) unless given
    config_path = tmp_path / "sybil.toml"
    config_path.write_text(tomli_w.dumps(config))
    coordinator = CoordinatorProcess(config_path, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    try:
        coordinator.start(url, timeout_s=120)
        yield url
    finally:
        coordinator.stop()


@pytest.fixture
def coordinator_url(tmp_path: Path) -> Iterator[str]:
    yield from start_coordinator(tmp_path, {})


SHORT_PROBATION_LEASE_S = 4.0


@pytest.fixture
def many_networks_url(tmp_path: Path) -> Iterator[str]:
    """The defaults, but probation leases that live 4 s (30 by default) and registration caps the Sybil has
    long got through (one key a minute from each network would do)."""
    sources = {
        "probation_lease_max_s": SHORT_PROBATION_LEASE_S,
        "register_burst": 1000,
        "prefix_register_burst": 1000,
    }
    yield from start_coordinator(tmp_path, sources)


async def try_register(client: LedgerClient) -> bool:
    try:
        await client.register(register_request())
    except RateLimitedError:
        await client.aclose()
        return False
    return True


@pytest.mark.slow
def test_sybil_keys_from_one_source_leave_honest_workers_their_share(coordinator_url: str) -> None:
    async def flood() -> None:
        started = time.monotonic()
        candidates = [
            client_from(coordinator_url, address) for address in SYBIL_ADDRESSES for _ in range(SYBIL_KEYS_PER_ADDRESS)
        ]
        answers = await asyncio.gather(*map(try_register, candidates))
        admitted = [client for client, ok in zip(candidates, answers, strict=True) if ok]
        refilled = int((time.monotonic() - started) * 0.2) + 1  # the prefix bucket's refill rate
        assert 64 <= len(admitted) <= 64 + refilled, len(admitted)  # the prefix's burst, plus what refilled

        forged = client_from(coordinator_url, "127.0.0.1", {"X-Forwarded-For": "198.51.100.1"})
        assert not await try_register(forged), "a forged X-Forwarded-For made the Sybil a new source"

        granted = []
        for _ in range(3):  # every admitted key asks for as much as it may hold, again and again
            leased = await asyncio.gather(*(c.lease(LeaseRequest(max_tasks=4)) for c in admitted))
            granted.append(sum(len(answer.tasks) for answer in leased))
        assert granted == [PROBATION_BUDGET, 0, 0]  # 64 keys, one budget

        honest = [client_from(coordinator_url, address) for address in HONEST_ADDRESSES]
        for client in honest:
            await client.register(register_request())
            assert len((await client.lease(LeaseRequest(max_tasks=4))).tasks) == 1  # a new identity's allowance
        for client in [*admitted, *honest]:
            await client.aclose()

    asyncio.run(flood())


NUM_SYBIL_NETWORKS = 16
SYBIL_KEYS_PER_NETWORK = 4  # 16 networks x a probation budget of 4: twice the cap of 32


@pytest.mark.slow
def test_sybil_keys_from_many_networks_leave_honest_newcomers_their_way_in(many_networks_url: str) -> None:
    async def flood() -> None:
        url = many_networks_url
        sybils = [
            client_from(url, f"127.64.{network}.1")
            for network in range(NUM_SYBIL_NETWORKS)
            for _ in range(SYBIL_KEYS_PER_NETWORK)
        ]
        for client in sybils:
            await client.register(register_request())

        async def hoard() -> int:
            leased = await asyncio.gather(*(c.lease(LeaseRequest(max_tasks=4)) for c in sybils))
            return sum(len(answer.tasks) for answer in leased)

        assert await hoard() == 16  # every network together: the probation pool, half the cap of 32
        honest = client_from(url, "127.1.0.1")
        await honest.register(register_request())
        assert (await honest.lease(LeaseRequest(max_tasks=2))).tasks == []  # the pool is full ...
        validator = client_from(url, "127.9.0.1")
        await validator.register(register_request("validator"))
        await asyncio.sleep(SHORT_PROBATION_LEASE_S + 1.5)  # ... until its hoarded leases lapse
        (first,) = (await honest.lease(LeaseRequest(max_tasks=2))).tasks  # a newcomer: first in line
        assert await hoard() <= 8  # hoarders may refill only half the pool
        submission_id = (await honest.submit(submission_for(first))).submission_id
        assert submission_id in {item.submission_id for item in (await validator.pending(limit=64)).submissions}
        await validator.post_verdict(Verdict(submission_id=submission_id, accepted=True))
        leased = (await honest.lease(LeaseRequest(max_tasks=2))).tasks
        assert len(leased) == 2  # one accepted group: out of probation, 1 + 1 leases from the room for verified work
        for client in [*sybils, honest, validator]:
            await client.aclose()

    asyncio.run(flood())
