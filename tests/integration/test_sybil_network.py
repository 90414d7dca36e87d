"""A Sybil flood against a real `prime-coordinator start`: many keys from one source, honest workers from others.

Every client binds its own loopback address (all of 127.0.0.0/8 is loopback on Linux), so the
coordinator sees distinct sources: the Sybil's keys come from 127.0.0.1-8 (one /24), the
honest workers from 127.1.0.1 and 127.2.0.1. The Sybil registers far more keys than the
per-address and per-prefix caps admit, forged ``X-Forwarded-For`` headers change nothing (no
trusted proxy is configured), and the keys it did register hoard every lease they can get;
the honest workers still get work, because the Sybil's keys share one probation budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomli_w

from protocol.errors import RateLimitedError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest
from runtime.ports import free_port
from tests.integration.network import REPO_ROOT
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import register_request

SYBIL_ADDRESSES = [f"127.0.0.{host}" for host in range(1, 9)]
HONEST_ADDRESSES = ["127.1.0.1", "127.2.0.1"]
SYBIL_KEYS_PER_ADDRESS = 25  # 200 keys: more than the 16 per address and 64 per prefix the defaults admit
PROBATION_BUDGET = 4  # the default


def client_from(url: str, address: str, headers: dict[str, str] | None = None) -> LedgerClient:
    """A ledger client whose connections leave from ``address``."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    http = httpx.AsyncClient(base_url=url, transport=transport, headers=headers, timeout=30)
    return LedgerClient(url, NodeIdentity.generate(), client=http)


@pytest.fixture
def coordinator_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "sybil",
        "data_dir": str(tmp_path / "run"),
        "api": {"host": "127.0.0.1", "port": port},
        "scheduling": {"prompts_per_task": 2, "group_size": 2, "max_tokens": 8, "max_open_leases": 32},
    }  # sources: the defaults (no allow-list, no trusted proxy)
    config_path = tmp_path / "sybil.toml"
    config_path.write_text(tomli_w.dumps(config))
    coordinator = CoordinatorProcess(config_path, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    try:
        coordinator.start(url, timeout_s=120)
        yield url
    finally:
        coordinator.stop()


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
