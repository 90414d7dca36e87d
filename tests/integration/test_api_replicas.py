"""API replicas: a coordinator and two `prime-coordinator start --api-only` on one PostgreSQL ledger, behind HAProxy.

Every process answers every route; what must hold across them is decided in the database (a task
leased once, a nonce used once) or carried by PostgreSQL's change feed (a long-poll on one replica
woken by a write through another).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import tomli_w

from protocol.errors import RateLimitedError, ReplayedNonceError
from protocol.identity import NodeIdentity, load_or_create_identity
from protocol.ledger_client import LedgerClient
from protocol.schemas import HeartbeatRequest, LeaseRequest, Task
from protocol.signing import sign_request
from runtime.children import stop_processes
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.ledger_helpers import (
    new_postgres_schema,
    register_request,
    scratch_postgres_database,
    submission_for,
)
from tests.support.load_balancer import require_haproxy, start_haproxy
from tests.support.network import tiny_policy

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
NODE_RATE_PER_S, NODE_BURST = 1.0, 30
"""A node's request rate limit, summed over the three API processes."""
RECHECK_S = 60.0
"""The long-polls' re-check, set far beyond the test's waits: only the change feed can wake them in time."""


@dataclass
class Replicated:
    balancer: str
    coordinator: str
    replicas: tuple[str, str]
    coordinator_id: str


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> Iterator[Replicated]:
    require_haproxy()
    tmp = tmp_path_factory.mktemp("replicas")
    ports = [free_port() for _ in range(4)]
    config = {
        "run_name": "replicated",
        "data_dir": str(tmp / "run"),
        "api": {
            "host": "127.0.0.1",
            "port": ports[1],
            "long_poll_recheck_s": RECHECK_S,
            "maintenance_interval_s": 1.0,  # each process counts the others every second
            "node_rate_per_s": NODE_RATE_PER_S,
            "node_burst": NODE_BURST,
        },
        "scheduling": {"prompts_per_task": 2, "group_size": 2, "max_tokens": 8, "lease_ttl_s": 600},
        "environment": {"type": "builtin", "name": "reverse_text"},
        "policy": {"start_checkpoint": str(tiny_policy(tmp / "policy", seed=0))},
        "trust": {"validators_open": True},
        "sources": {"allow": ["127.0.0.0/8"], "trusted_proxies": ["127.0.0.1"]},
    }
    with scratch_postgres_database(postgres_url) as database_url:
        config["ledger"] = {"url": new_postgres_schema(database_url)}
        path = tmp / "run.toml"
        path.write_text(tomli_w.dumps(config))
        processes = [CoordinatorProcess(path, tmp / f"api{i}.log") for i in range(3)]
        balancer = None
        urls = [f"127.0.0.1:{port}" for port in ports]
        try:
            processes[0].start(f"http://{urls[1]}")
            for index, process in enumerate(processes[1:], start=2):
                process.start(f"http://{urls[index]}", ("--api-only", "--port", str(ports[index])))
            balancer = start_haproxy(urls[0], urls[1], (urls[2], urls[3]), tmp / "haproxy.log")
            coordinator_id = load_or_create_identity(tmp / "run").node_id
            http = [f"http://{url}" for url in urls]
            yield Replicated(http[0], http[1], (http[2], http[3]), coordinator_id)
        finally:
            if balancer is not None:
                stop_processes([balancer], timeout_s=10)
            for process in reversed(processes):
                process.stop()


def test_a_replica_serves_the_coordinators_signed_run_spec(replicated: Replicated) -> None:
    async def main() -> None:
        for url in (replicated.balancer, *replicated.replicas):
            async with LedgerClient(url, NodeIdentity.generate()) as client:
                spec = await client.run_spec(replicated.coordinator_id)  # verified against the coordinator's key
                assert spec.run_name == "replicated"
        # Policy weights come from the coordinator's origin alone: the balancer sends /shardcast there.
        assert httpx.get(f"{replicated.replicas[0]}/shardcast/v/0/manifest.json", timeout=10).status_code == 404
        for _ in range(3):  # round robin would have reached a replica by now
            assert httpx.get(f"{replicated.balancer}/shardcast/v/0/manifest.json", timeout=10).status_code == 200

    asyncio.run(main())


def test_tasks_leased_through_every_process_are_leased_once(replicated: Replicated) -> None:
    urls = [replicated.balancer, replicated.coordinator, *replicated.replicas]

    async def lease_all(url: str) -> list[Task]:
        async with LedgerClient(url, NodeIdentity.generate()) as client:
            await client.register(register_request())
            leased: list[Task] = []
            for _ in range(4):
                leased += (await client.lease(LeaseRequest(max_tasks=2))).tasks
            return leased

    async def main() -> list[Task]:
        batches = await asyncio.gather(*(lease_all(url) for url in urls for _ in range(3)))
        return [task for batch in batches for task in batch]

    tasks = asyncio.run(main())
    assert len(tasks) >= 3 * len(urls)
    assert len({task.task_id for task in tasks}) == len(tasks)
    assert len({task.lease_id for task in tasks}) == len(tasks)


def test_a_nonce_used_on_one_replica_is_refused_on_the_other(replicated: Replicated) -> None:
    identity = NodeIdentity.generate()

    async def register() -> None:
        async with LedgerClient(replicated.replicas[0], identity) as client:
            await client.register(register_request())

    asyncio.run(register())
    body = b'{"v":1,"max_tasks":1}'
    headers = {"Content-Type": "application/json", **sign_request(identity, "POST", "/v1/leases", body)}
    first = httpx.post(f"{replicated.replicas[0]}/v1/leases", content=body, headers=headers, timeout=10)
    assert first.status_code == 200, first.text
    for url in (replicated.replicas[1], replicated.coordinator, replicated.balancer):
        replay = httpx.post(f"{url}/v1/leases", content=body, headers=headers, timeout=10)
        assert replay.status_code == 401 and replay.json()["error"] == ReplayedNonceError.code, replay.text


def test_a_long_poll_on_one_replica_wakes_on_a_submission_through_another(replicated: Replicated) -> None:
    async def main() -> tuple[float, int]:
        async with (
            LedgerClient(replicated.replicas[0], NodeIdentity.generate()) as validator,
            LedgerClient(replicated.replicas[1], NodeIdentity.generate()) as worker,
        ):
            await validator.register(register_request("validator"))
            await worker.register(register_request())
            waiting = asyncio.create_task(validator.pending(limit=64, wait_s=15.0))
            await asyncio.sleep(1.0)
            assert not waiting.done()  # nothing to audit yet: the long-poll waits on replica 1
            (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
            await worker.submit(submission_for(task))
            submitted = time.monotonic()
            pending = await waiting
            return time.monotonic() - submitted, len(pending.submissions)

    woke_after_s, found = asyncio.run(main())
    assert found >= 1
    assert woke_after_s < 10.0  # the re-check is 60 s away and the wait 15 s: only the change feed woke it


def test_a_nodes_rate_limit_is_summed_over_the_processes(replicated: Replicated) -> None:
    time.sleep(2.0)  # two maintenance rounds: every process has counted all three

    async def main() -> tuple[int, float]:
        async with LedgerClient(replicated.balancer, NodeIdentity.generate()) as client:
            started = time.monotonic()
            await client.register(register_request())
            allowed = 1
            for _ in range(3 * NODE_BURST):  # round robin: a third to each process
                try:
                    await client.heartbeat(HeartbeatRequest(policy_versions_held=[], tokens_per_s=0.0))
                    allowed += 1
                except RateLimitedError:
                    pass
            return allowed, time.monotonic() - started

    allowed, elapsed_s = asyncio.run(main())
    # Each process alone would let the whole burst through (3 x 30); together they allow one burst and the refill.
    assert NODE_BURST - 3 <= allowed <= NODE_BURST + NODE_RATE_PER_S * elapsed_s + 3
