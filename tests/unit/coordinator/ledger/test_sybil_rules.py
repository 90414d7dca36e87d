"""Sybil rules: sources by network prefix, registration caps, probation, per-source lease grants and concurrency."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive, Scope, Send

from coordinator.config import SourcesConfig
from coordinator.ledger.reputation import ProbationPolicy, lease_allowance, on_probation
from coordinator.ledger.scheduling import grant_count
from coordinator.ledger.sources import SourcePolicy
from coordinator.serving.middleware import SourceConcurrency
from coordinator.serving.ratelimit import RateLimiter, RegistrationLimit


def policy(**fields: object) -> SourcePolicy:
    return SourcePolicy(SourcesConfig.model_validate(fields))


@pytest.mark.parametrize(
    ("address", "prefix"),
    [
        ("203.0.113.7", "203.0.113.0/24"),
        ("203.0.113.250", "203.0.113.0/24"),
        ("203.0.114.7", "203.0.114.0/24"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.9", "198.51.100.0/24"),  # an IPv4 client on a dual-stack socket
        ("testclient", "testclient"),  # not an address: itself
    ],
)
def test_a_source_is_the_address_network_prefix(address: str, prefix: str) -> None:
    assert policy().prefix(address) == prefix


def test_prefix_lengths_are_settings() -> None:
    assert policy(ipv4_prefix=32).prefix("203.0.113.7") == "203.0.113.7/32"
    assert policy(ipv4_prefix=16).prefix("203.0.113.7") == "203.0.0.0/16"
    assert policy(ipv6_prefix=48).prefix("2001:db8:1:2::1") == "2001:db8:1::/48"


def test_allow_listed_keys_are_sources_of_their_own() -> None:
    sources = policy(allow=["127.0.0.0/8", "10.1.0.0/16"])
    assert all(sources.is_allowed(address) for address in ("127.3.0.1", "10.1.200.3", "::ffff:10.1.0.1"))
    assert not sources.is_allowed("10.2.0.1") and not sources.is_allowed("testclient")
    assert sources.source_of("key-a", "127.0.0.1") == "node:key-a"
    assert sources.source_of("key-a", "10.2.0.1") == sources.source_of("key-b", "10.2.0.99") == "10.2.0.0/24"


def test_answers_by_address_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import coordinator.ledger.sources as sources

    monkeypatch.setattr(sources, "MAX_REMEMBERED", 4)
    sources_of = policy(allow=["10.0.0.0/8"])
    addresses = [f"203.0.{i}.7" for i in range(10)] + ["10.1.2.3", "not-an-ip"]
    for _ in range(2):  # the second time from memory: the same answers
        assert [sources_of.prefix(a) for a in addresses[:3]] == ["203.0.0.0/24", "203.0.1.0/24", "203.0.2.0/24"]
        assert sources_of.is_allowed("10.1.2.3") and not sources_of.is_allowed("203.0.1.7")
        assert sources_of.source_of("k", "10.1.2.3") == "node:k" and sources_of.prefix("not-an-ip") == "not-an-ip"
        assert all(sources_of.prefix(a).endswith(".0/24") for a in addresses[:10])
    assert len(sources_of._prefixes) <= 4 and len(sources_of._allowed) <= 4
    sources_of.prefix("x" * 1000)  # not an address (a forged forwarded header): answered, not remembered
    assert "x" * 1000 not in sources_of._prefixes


def test_bad_networks_are_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="not an IP address or CIDR"):
        SourcesConfig(allow=["10.0.0.0/33"])
    with pytest.raises(ValueError, match="not an IP address or CIDR"):
        SourcesConfig(trusted_proxies=["proxy.example"])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_registrations_are_capped_per_address_and_per_prefix() -> None:
    clock = Clock()
    sources = policy(allow=["127.0.0.0/8"])
    limit = RegistrationLimit(sources, RateLimiter(1.0, 2, clock=clock), RateLimiter(1.0, 3, clock=clock))
    assert limit.retry_after_s("198.51.100.1") is None
    assert limit.retry_after_s("198.51.100.1") is None
    assert limit.retry_after_s("198.51.100.1") is not None  # the address's burst is spent
    assert limit.retry_after_s("198.51.100.2") is None  # another address: the prefix's third
    assert limit.retry_after_s("198.51.100.3") is not None  # the prefix's burst is spent too
    assert limit.retry_after_s("198.51.101.1") is None  # another prefix
    assert all(limit.retry_after_s("127.0.0.1") is None for _ in range(100))  # allow-listed: never limited
    clock.now += 1.0
    assert limit.retry_after_s("198.51.100.4") is None  # refilled


PROBATION = ProbationPolicy(new_identity_leases=1, max_leases_per_node=4, proven_after_accepted=2)


@pytest.mark.parametrize(
    ("accepted", "rejected", "allowance", "probation"),
    [
        (0, 0, 1, True),  # new: a small allowance, on probation
        (1, 0, 2, True),
        (2, 0, 3, False),  # proven
        (5, 0, 4, False),  # capped at the per-node limit
        (3, 2, 2, True),  # rejections take allowance (and proof) away
        (0, 2, 1, True),  # never below one lease
    ],
)
def test_allowance_grows_with_accepted_work_and_shrinks_with_rejections(
    accepted: int, rejected: int, allowance: int, probation: bool
) -> None:
    assert lease_allowance(PROBATION, accepted, rejected) == allowance
    assert on_probation(PROBATION, accepted, rejected) is probation


@pytest.mark.parametrize(
    ("held_by_node", "node_cap", "open_total", "live_sources", "held_by_source", "probation_room", "expected"),
    [
        (0, 2, 0, 2, 0, None, 2),
        (0, 2, 0, 2, 5, None, 0),  # 10 slots over 2 sources: the source already holds its 5
        (0, 2, 0, 2, 4, None, 1),  # one left in the source's share, whichever of its keys asks
        (0, 2, 0, 2, 0, 1, 1),  # on probation: the source's budget binds
        (0, 2, 0, 2, 0, -3, 0),  # budget overspent (e.g. concurrent calls): nothing, never negative
        (0, 1, 0, 2, 0, 4, 1),  # its own earned allowance binds
        (0, 2, 9, 2, 0, None, 1),  # network-wide cap
    ],
)
def test_grant_count_per_source(
    held_by_node: int,
    node_cap: int,
    open_total: int,
    live_sources: int,
    held_by_source: int,
    probation_room: int | None,
    expected: int,
) -> None:
    got = grant_count(5, held_by_node, node_cap, open_total, 10, live_sources, held_by_source, probation_room)
    assert got == expected


def test_a_source_gets_a_few_requests_in_at_once_and_the_rest_wait_or_are_refused() -> None:
    asyncio.run(a_flood_and_two_other_sources())


async def a_flood_and_two_other_sources() -> None:
    release = asyncio.Event()
    inside: dict[str, int] = {}
    most_inside: dict[str, int] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        host = scope["client"][0]
        inside[host] = inside.get(host, 0) + 1
        most_inside[host] = max(most_inside.get(host, 0), inside[host])
        if host.startswith("203.0.113."):  # the flood's requests hold their slots until released
            await release.wait()
        inside[host] -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limited = SourceConcurrency(app, policy(allow=["127.0.0.0/8"]), 2, 5)

    async def call(address: str, path: str = "/v1/leases") -> int:
        statuses: list[int] = []

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "path": path, "client": (address, 1), "headers": [], "method": "POST"}
        await limited(scope, receive, send)
        return statuses[0]

    flood = [asyncio.create_task(call(f"203.0.113.{host}")) for host in range(1, 11)]  # 10 from one /24
    await asyncio.sleep(0.05)
    assert most_inside == {f"203.0.113.{host}": 1 for host in (1, 2)}  # two inside, the others wait
    assert await asyncio.wait_for(call("198.51.100.1"), 5) == 200  # another source is not held up
    assert await asyncio.wait_for(call("127.0.0.1"), 5) == 200  # allow-listed
    shard = asyncio.create_task(call("203.0.113.1", "/shardcast/v1/versions/0/shards/0"))
    await asyncio.sleep(0.05)
    assert most_inside["203.0.113.1"] == 2  # a policy download is not a ledger call: not held back
    refused = [task for task in flood if task.done()]
    assert len(refused) == 3 and all(task.result() == 429 for task in refused)  # over 2 inside + 5 waiting
    release.set()
    assert sorted(await asyncio.gather(*flood, shard)) == [200] * 8 + [429] * 3
