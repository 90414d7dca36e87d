"""The libp2p layer on real sockets, in one process: Noise only, node id = peer id, gossip gated by the filter.

Three :class:`~runtime.p2p.gossip.Gossip` nodes (a coordinator, a worker, a stranger whose
own filter is bypassed so it can publish forgeries) run their py-libp2p hosts in trio threads
on 127.0.0.1. A host that offers only plaintext security cannot connect to them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from protocol.announcements import TOPICS, Accepted, encode_announcement, sign_announcement
from protocol.errors import ProtocolError, RemoteUnavailableError
from protocol.identity import NodeIdentity
from protocol.schemas import P2PInfo, PolicyAnnouncement, RelayAnnouncement
from runtime.p2p.config import P2PConfig
from runtime.p2p.gossip import MAX_HOSTILE_MESSAGES, Gossip

pytestmark = pytest.mark.slow


def policy(version: int) -> PolicyAnnouncement:
    return PolicyAnnouncement(version=version, manifest_sha256="cd" * 32, total_size_bytes=10, published_at=time.time())


class Inbox:
    def __init__(self) -> None:
        self.items: list[Accepted] = []
        self.arrived = threading.Event()

    def __call__(self, accepted: Accepted) -> None:
        self.items.append(accepted)
        self.arrived.set()


@pytest.fixture
def nodes() -> Iterator[tuple[Gossip, Gossip, Gossip, Inbox]]:
    coordinator_key, worker_key, stranger_key = (NodeIdentity.generate() for _ in range(3))
    coordinator = Gossip(coordinator_key, P2PConfig(), coordinator_key.node_id)
    worker = Gossip(worker_key, P2PConfig(), coordinator_key.node_id)
    stranger = Gossip(stranger_key, P2PConfig(), coordinator_key.node_id)
    stranger._validate = lambda *_: True  # type: ignore[method-assign]  # a hostile node forwards anything
    inbox = Inbox()
    worker.on("policy_version", inbox)
    worker.on("relay", inbox)
    started = []
    try:
        for node in (coordinator, worker, stranger):
            node.start()
            started.append(node)
        worker.join(coordinator.info())
        stranger.node.connect(worker.node.addrs[0])
        stranger.node.connect(coordinator.node.addrs[0])
        time.sleep(1.0)  # subscriptions exchanged
        yield coordinator, worker, stranger, inbox
    finally:
        for node in started:
            node.stop()


def test_announcements_reach_the_worker_and_forgeries_do_not(nodes: tuple[Gossip, Gossip, Gossip, Inbox]) -> None:
    coordinator, worker, stranger, inbox = nodes
    assert all(addr.endswith(f"/p2p/{coordinator.identity.node_id}") for addr in coordinator.node.addrs)
    coordinator.announce(policy(1))
    assert inbox.arrived.wait(5)
    assert [(a.signer, a.body) for a in inbox.items] == [(coordinator.identity.node_id, inbox.items[0].body)]
    assert isinstance(inbox.items[0].body, PolicyAnnouncement) and inbox.items[0].body.version == 1

    inbox.arrived.clear()
    forged = encode_announcement(sign_announcement(stranger.identity, policy(2)))
    stranger.node.publish(TOPICS["policy_version"], forged)
    stranger.node.publish(TOPICS["policy_version"], b"{not json")
    replay = encode_announcement(sign_announcement(coordinator.identity, policy(1)))
    stranger.node.publish(TOPICS["policy_version"], replay)  # an older version than the one accepted
    relay = RelayAnnouncement(url="http://127.0.0.1:9999", latest_version=1)
    stranger.node.publish(TOPICS["relay"], encode_announcement(sign_announcement(stranger.identity, relay)))
    assert inbox.arrived.wait(5)
    time.sleep(0.5)
    assert [a.body for a in inbox.items[1:]] == [relay]  # a relay may speak for itself; nothing else got through
    assert worker.filter.num_dropped == {"forbidden": 1, "malformed": 1, "conflict": 1}
    assert coordinator.filter.num_dropped["forbidden"] == 1


def test_a_peer_forwarding_forgeries_is_blacklisted(nodes: tuple[Gossip, Gossip, Gossip, Inbox]) -> None:
    _coordinator, worker, stranger, inbox = nodes
    for version in range(MAX_HOSTILE_MESSAGES):
        forged = encode_announcement(sign_announcement(stranger.identity, policy(100 + version)))
        stranger.node.publish(TOPICS["policy_version"], forged)
        time.sleep(0.12)  # py-libp2p's gossipsub forwards at most 10 messages per topic and second
    time.sleep(0.5)
    assert worker.filter.num_hostile_by_sender[stranger.identity.node_id] == MAX_HOSTILE_MESSAGES
    relay = RelayAnnouncement(url="http://127.0.0.1:9999", latest_version=1)  # valid, but from a blacklisted peer
    stranger.node.publish(TOPICS["relay"], encode_announcement(sign_announcement(stranger.identity, relay)))
    time.sleep(1.0)
    assert inbox.items == []
    assert worker.filter.num_accepted == 0


def test_only_the_pinned_coordinator_is_joined(nodes: tuple[Gossip, Gossip, Gossip, Inbox]) -> None:
    _coordinator, worker, stranger, _inbox = nodes
    with pytest.raises(ProtocolError):
        worker.join(stranger.info())
    impostor = P2PInfo(peer_id=worker.trusted_coordinator_id or "", addrs=stranger.node.addrs, topics=[])
    with pytest.raises(RemoteUnavailableError):  # the addresses are not the coordinator's
        worker.join(impostor)


def test_a_peer_offering_only_plaintext_cannot_connect(nodes: tuple[Gossip, Gossip, Gossip, Inbox]) -> None:
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport

    coordinator, _worker, _stranger, _inbox = nodes
    outcome: dict[str, str] = {}
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]

    async def dial_from_plaintext_host(name: str, addr: str) -> None:
        key_pair = create_new_key_pair()
        host = new_host(key_pair=key_pair, sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)})
        async with host.run(listen):
            try:
                with trio.fail_after(10):
                    await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(addr)))
                outcome[name] = "connected"
            except Exception as exc:
                outcome[name] = f"refused: {exc!r}"

    async def main() -> None:
        await dial_from_plaintext_host("coordinator", coordinator.node.addrs[0])
        default_host = new_host(key_pair=create_new_key_pair())  # py-libp2p's defaults offer plaintext too
        async with default_host.run(listen):
            addr = f"{default_host.get_addrs()[0]}"
            await dial_from_plaintext_host("default host", addr)

    trio.run(main)
    assert outcome["default host"] == "connected", outcome  # the control: plaintext works where it is offered
    assert outcome["coordinator"].startswith("refused"), outcome


def test_a_second_node_on_a_taken_gossip_port_is_refused() -> None:
    """py-libp2p listens with SO_REUSEPORT: without the check a second node would share the port silently."""
    from protocol.errors import StartupError
    from runtime.p2p.host import P2PNode

    first = P2PNode(NodeIdentity.generate())
    first.start([])
    try:
        port = int(first.addrs[0].split("/tcp/")[1].split("/")[0])
        second = P2PNode(NodeIdentity.generate(), port=port)
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port} for gossip"):
            second.start([])
    finally:
        first.stop()
