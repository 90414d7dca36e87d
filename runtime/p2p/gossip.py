"""Signed announcements over libp2p: what every role uses to announce and to hear announcements.

:class:`Gossip` joins a :class:`~runtime.p2p.host.P2PNode` (subscribed to every announcement
topic, so each node also forwards what it accepts) with an
:class:`~protocol.announcements.AnnouncementFilter` that gates each message before it is
delivered or forwarded, and calls the listeners registered per kind with the accepted ones.
Bootstrap needs only the coordinator's URL: ``GET /v1/p2p`` names its peer id and multiaddrs,
and a node dials them only when that peer id is the coordinator it already pins (Noise then
proves the peer holds that key). :func:`keep_joined` redials when the coordinator goes away
(a restart); any failure here only costs latency, as HTTP polling stays the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from protocol import routes
from protocol.announcements import (
    BODY_MODELS,
    TOPICS,
    Accepted,
    AnnouncementFilter,
    Body,
    Kind,
    encode_announcement,
    sign_announcement,
)
from protocol.errors import PrimeError, ProtocolError, RemoteUnavailableError
from protocol.identity import NodeIdentity
from protocol.schemas import Announcement, P2PInfo
from runtime.p2p.config import P2PConfig
from runtime.p2p.host import P2PNode, TopicSpec

log = logging.getLogger("runtime.p2p")
MAX_HOSTILE_MESSAGES = 10
"""Forged, malformed or wrongly signed announcements a peer may forward before it is disconnected and ignored."""
Listener = Callable[[Accepted], None]
"""Called in the libp2p thread with each accepted announcement: hand it over, do not block."""


class Gossip:
    """A node's membership of the gossip network: announce, and hear what passes the filter."""

    def __init__(self, identity: NodeIdentity, config: P2PConfig, trusted_coordinator_id: str | None) -> None:
        self.identity = identity
        self.config = config
        self.trusted_coordinator_id = trusted_coordinator_id
        self.filter = AnnouncementFilter(trusted_coordinator_id, config.max_announcement_age_s)
        self.node = P2PNode(identity, config.host, config.port)
        self._listeners: dict[Kind, list[Listener]] = {kind: [] for kind in TOPICS}

    def on(self, kind: Kind, listener: Listener) -> None:
        """Call ``listener`` with every accepted announcement of ``kind`` (register before start)."""
        self._listeners[kind].append(listener)

    def start(self) -> list[str]:
        """Start the host, subscribed to every announcement topic; dial the configured extra peers."""
        specs = [TopicSpec(topic, self._validate, self._deliver) for topic in TOPICS.values()]
        addrs = self.node.start(specs)
        log.info("p2p node %s listening on %s", self.identity.node_id, ", ".join(addrs))
        for addr in self.config.peers:
            try:
                self.node.connect(addr)
            except RemoteUnavailableError as exc:
                log.warning("p2p: %s", exc.message)
        return addrs

    def _validate(self, topic: str, data: bytes, sender: str) -> bool:
        if self.filter.accept(topic, data, sender) is not None:
            return True
        if self.filter.num_hostile_by_sender[sender] == MAX_HOSTILE_MESSAGES:
            log.warning("p2p: blacklisting peer %s after %d invalid announcements", sender, MAX_HOSTILE_MESSAGES)
            self.node.blacklist_now(sender)
        return False

    def _deliver(self, topic: str, data: bytes) -> None:
        # Already checked by _validate (libp2p runs validators before delivery): parse only.
        announcement = Announcement.model_validate_json(data)
        kind: Kind = announcement.kind
        body = BODY_MODELS[kind].model_validate(announcement.body)
        accepted = Accepted(kind, announcement.signer, announcement.sent_at, body)
        for listener in self._listeners[kind]:
            listener(accepted)

    def announce(self, body: Body) -> Announcement:
        """Sign ``body`` with this node's key and publish it on its topic."""
        announcement = sign_announcement(self.identity, body)
        self.node.publish(TOPICS[announcement.kind], encode_announcement(announcement))
        return announcement

    def info(self, reached_as: str | None = None) -> P2PInfo:
        """What ``GET /v1/p2p`` answers: this node's peer id and dialable multiaddrs. ``reached_as``, the host a
        client reached the API by, stands in for a wildcard bind address (0.0.0.0) when no public_host is set."""
        public_host = self.config.public_host
        addrs = [advertised_addr(addr, public_host, reached_as) for addr in self.node.addrs[:16]]
        return P2PInfo(peer_id=self.identity.node_id, addrs=addrs, topics=list(TOPICS.values()))

    def join(self, info: P2PInfo) -> None:
        """Dial the coordinator described by ``info``; refused unless it is the pinned coordinator."""
        if self.trusted_coordinator_id is not None and info.peer_id != self.trusted_coordinator_id:
            raise ProtocolError(
                f"{routes.P2P} names peer {info.peer_id}, not the pinned coordinator {self.trusted_coordinator_id}"
            )
        failures = []
        for addr in info.addrs:
            if not addr.endswith(f"/p2p/{info.peer_id}"):
                failures.append(f"{addr}: not an address of {info.peer_id}")
                continue
            try:
                self.node.connect(addr)
                log.info("p2p: connected to the coordinator at %s", addr)
                return
            except RemoteUnavailableError as exc:
                failures.append(exc.message)
        raise RemoteUnavailableError(f"could not reach the coordinator's p2p node: {'; '.join(failures) or 'no addrs'}")

    def stop(self) -> None:
        self.node.stop()


def advertised_addr(addr: str, public_host: str | None, reached_as: str | None = None) -> str:
    """``addr`` with its bind host replaced by ``public_host`` (an IPv4/IPv6 address or a DNS name); without one, a
    wildcard bind host (0.0.0.0, ::), which no other machine can dial, by ``reached_as`` (how the asker reached us)."""
    _empty, _family, host, rest = addr.split("/", 3)
    if public_host is None:
        if host not in WILDCARD_HOSTS or not reached_as or not is_host_name(reached_as):
            return addr
        public_host = reached_as
    try:
        family = "ip6" if ipaddress.ip_address(public_host).version == 6 else "ip4"
    except ValueError:
        family = "dns"
    return f"/{family}/{public_host}/{rest}"


WILDCARD_HOSTS = ("0.0.0.0", "::")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


def is_host_name(text: str) -> bool:
    """An IP address or a DNS name (what may go into a multiaddr's host part)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_HOST_NAME.match(text))


async def fetch_p2p_info(coordinator_url: str, timeout_s: float = 5.0) -> P2PInfo:
    """The coordinator's ``GET /v1/p2p``; RemoteUnavailableError when it cannot be had."""
    url = coordinator_url.rstrip("/") + routes.P2P
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        raise RemoteUnavailableError(f"{url}: {exc!r}") from exc
    if response.status_code != 200:
        raise RemoteUnavailableError(f"{url} answered {response.status_code} (is p2p enabled on the coordinator?)")
    try:
        return P2PInfo.model_validate_json(response.content)
    except ValidationError as exc:
        raise ProtocolError(f"{url} sent a malformed answer: {exc.errors()[0]['msg']}") from exc


async def keep_joined(gossip: Gossip, coordinator_url: str, stop: asyncio.Event, check_interval_s: float = 5.0) -> None:
    """Stay connected to the coordinator's p2p node: dial now, and again whenever no peer is left."""
    while not stop.is_set():
        if gossip.node.num_peers() == 0:
            try:
                info = await fetch_p2p_info(coordinator_url)
                await asyncio.to_thread(gossip.join, info)
            except PrimeError as exc:
                log.warning(
                    "p2p: not joined (%s); retrying in %.0f s, polling meanwhile", exc.message, check_interval_s
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=check_interval_s)


async def start_gossip(
    identity: NodeIdentity,
    config: P2PConfig,
    trusted_coordinator_id: str,
    listeners: dict[Kind, Listener],
) -> Gossip | None:
    """A started :class:`Gossip` for an asyncio node, or None (logged) when p2p is off or cannot start."""
    if not config.enabled:
        log.info("p2p is disabled (--no-p2p): new versions are learned by polling the ledger")
        return None
    gossip = Gossip(identity, config, trusted_coordinator_id)
    for kind, listener in listeners.items():
        gossip.on(kind, listener)
    try:
        await asyncio.to_thread(gossip.start)
    except Exception as exc:
        log.warning("p2p could not start (%r); polling the ledger only", exc)
        await asyncio.to_thread(gossip.stop)
        return None
    return gossip
