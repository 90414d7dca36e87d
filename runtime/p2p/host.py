"""A py-libp2p host with gossipsub, run by trio in its own thread and driven by blocking calls.

Workers, validators and the coordinator are asyncio or plain sync programs, and py-libp2p is
trio: :class:`P2PNode` owns one thread that runs ``trio.run`` and exposes blocking methods
(:meth:`start`, :meth:`connect`, :meth:`publish`, :meth:`stop`) that hop into it with
``trio.from_thread``; asyncio code calls them through ``asyncio.to_thread``. The host's key is
the node's own Ed25519 key, so its peer id is the node id; Noise is the only security
transport offered (py-libp2p would otherwise also offer TLS, SECIO and plaintext), TCP the only
transport. Each topic gets a validator, called in the trio thread before a message is
delivered or forwarded (a refused message goes no further), and a handler for delivered ones.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from protocol.errors import RemoteUnavailableError, StartupError
from protocol.identity import NodeIdentity

log = logging.getLogger("runtime.p2p")

Validator = Callable[[str, bytes, str], bool]
"""(topic, data, forwarding peer id) -> whether the message may be delivered and forwarded."""
Handler = Callable[[str, bytes], None]
"""(topic, data) of a validated message; runs in the trio thread, so it must be quick and thread-safe."""


@dataclass(frozen=True)
class TopicSpec:
    topic: str
    validator: Validator
    handler: Handler | None = None
    """None: relay the topic (validate and forward) without delivering it to the node."""


def check_port_free(host: str, port: int) -> None:
    """A StartupError when another process listens on ``host:port``.

    py-libp2p binds its listener with SO_REUSEPORT (for hole punching), so a second node on a
    taken port would listen beside the first without an error, and peers would reach one or the
    other at random. A plain bind, without SO_REUSEPORT, fails while anyone listens there.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {host}:{port} for gossip: {exc.strerror} (another node, perhaps another "
                "coordinator, uses that port)",
                "stop it, or pick another port with --set p2p.port=N (0 picks a free one)",
            ) from exc


class P2PNode:
    """One libp2p host (TCP, Noise, yamux) with gossipsub, in a background trio thread."""

    def __init__(self, identity: NodeIdentity, host: str = "127.0.0.1", port: int = 0) -> None:
        self.identity = identity
        self.listen_host = host
        self.listen_port = port
        self.addrs: list[str] = []
        self._thread: threading.Thread | None = None
        self._token: Any = None
        self._pubsub: Any = None
        self._host: Any = None
        self._stop: Any = None

    @property
    def peer_id(self) -> str:
        return self.identity.node_id

    def start(self, topics: Sequence[TopicSpec], timeout_s: float = 30.0) -> list[str]:
        """Listen, subscribe to ``topics`` and return the listen multiaddrs (with /p2p/<peer id>)."""
        if self.listen_port:
            check_port_free(self.listen_host, self.listen_port)
        ready: Future[list[str]] = Future()
        self._thread = threading.Thread(target=self._run, args=(list(topics), ready), name="libp2p", daemon=True)
        self._thread.start()
        try:
            self.addrs = ready.result(timeout=timeout_s)
        except TimeoutError as exc:
            raise RemoteUnavailableError(f"the libp2p host did not start within {timeout_s} s") from exc
        return self.addrs

    def _run(self, topics: list[TopicSpec], ready: Future[list[str]]) -> None:
        import trio

        try:
            trio.run(self._main, topics, ready)
        except BaseException as exc:  # the node goes on without gossip: HTTP polling is the fallback
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.error("the libp2p host stopped: %r; gossip is off, polling goes on", exc)

    async def _main(self, topics: list[TopicSpec], ready: Future[list[str]]) -> None:
        import multiaddr
        import trio
        from libp2p import new_host
        from libp2p.crypto.ed25519 import Ed25519PrivateKey
        from libp2p.crypto.keys import KeyPair
        from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
        from libp2p.network.config import ConnectionConfig
        from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
        from libp2p.pubsub.pubsub import Pubsub
        from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
        from libp2p.security.noise.transport import Transport as NoiseTransport
        from libp2p.tools.anyio_service import background_trio_service

        private_key = Ed25519PrivateKey.from_bytes(self.identity.private_key_bytes)
        key_pair = KeyPair(private_key, private_key.get_public_key())
        noise = NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
        listen = [multiaddr.Multiaddr(f"/ip4/{self.listen_host}/tcp/{self.listen_port}")]
        # One connection per peer: with more allowed, py-libp2p waits out a 250 ms happy-eyeballs
        # delay on every dial hoping for a second one.
        host = new_host(
            key_pair=key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},
            listen_addrs=listen,
            connection_config=ConnectionConfig(max_connections_per_peer=1),
        )
        router = GossipSub([PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12)
        pubsub = Pubsub(host, router)
        async with host.run(listen), background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                for spec in topics:
                    pubsub.set_topic_validator(spec.topic, _libp2p_validator(spec), False)
                    subscription = await pubsub.subscribe(spec.topic)
                    nursery.start_soon(_deliver, spec, subscription)
                self._host, self._pubsub = host, pubsub
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                ready.set_result([str(addr) for addr in host.get_addrs()])
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        import trio

        if self._token is None:
            raise RemoteUnavailableError("the libp2p host is not running")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError as exc:
            raise RemoteUnavailableError("the libp2p host has stopped") from exc

    def connect(self, addr: str, timeout_s: float = 10.0) -> None:
        """Dial ``addr`` (a multiaddr ending in /p2p/<peer id>); RemoteUnavailableError when it fails."""

        async def dial() -> None:
            import multiaddr
            import trio
            from libp2p.peer.peerinfo import info_from_p2p_addr

            with trio.fail_after(timeout_s):
                await self._host.connect(info_from_p2p_addr(multiaddr.Multiaddr(addr)))

        try:
            self._call(dial)
        except RemoteUnavailableError:
            raise
        except Exception as exc:
            raise RemoteUnavailableError(f"could not connect to {addr}: {exc!r}") from exc

    def publish(self, topic: str, data: bytes) -> None:
        self._call(self._pubsub.publish, topic, data)

    def blacklist_now(self, peer_id: str) -> None:
        """Disconnect ``peer_id`` and ignore it from now on; call from the trio thread (a validator or handler)."""
        from libp2p.peer.id import ID

        self._pubsub.add_to_blacklist(ID.from_base58(peer_id))

    def num_peers(self) -> int:
        if self._host is None:
            return 0
        return len(self._host.get_network().connections)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the host and end the trio thread (no-op when not running)."""
        if self._token is not None:
            with contextlib.suppress(RemoteUnavailableError):
                self._call(_set_event, self._stop)
            self._token = None
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                log.warning("the libp2p thread did not stop within %.0f s; leaving it (daemon)", timeout_s)
            self._thread = None


async def _set_event(event: Any) -> None:
    event.set()


def _libp2p_validator(spec: TopicSpec) -> Callable[[Any, Any], bool]:
    def validate(forwarder: Any, msg: Any) -> bool:
        try:
            return spec.validator(spec.topic, bytes(msg.data), str(forwarder))
        except Exception as exc:  # a validator bug must not take the host down; drop the message
            log.warning("gossip validator on %s failed: %r", spec.topic, exc)
            return False

    return validate


async def _deliver(spec: TopicSpec, subscription: Any) -> None:
    while True:
        msg = await subscription.get()
        if spec.handler is None:
            continue
        try:
            spec.handler(spec.topic, bytes(msg.data))
        except Exception as exc:
            log.warning("gossip handler on %s failed: %r", spec.topic, exc)
