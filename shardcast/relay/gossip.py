"""A relay on the gossip network: mirror each announced policy version at once, and announce itself.

The relay joins the coordinator's gossip network through its ``GET /v1/p2p`` (the coordinator
URL is configured, or taken from an upstream ending in ``/shardcast``). A policy-version
announcement (accepted only from the coordinator the relay already trusts for manifests) wakes
the mirroring loop so it polls its upstreams now instead of at the next interval. The relay
announces its own URL, signed with its own node key, when its newest complete version changes
and every ``REANNOUNCE_S``: workers add it to the relays they download from, which is safe
because every shard is still checked against the coordinator's signed manifest. Without gossip
(``--no-p2p``, or when it cannot start) the relay just polls, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from protocol.announcements import Accepted
from protocol.errors import PrimeError
from protocol.identity import load_or_create_identity
from protocol.schemas import RelayAnnouncement
from runtime.p2p.gossip import Gossip, keep_joined, start_gossip
from shardcast.relay.config import RelayConfig
from shardcast.relay.mirror import RelayMirror

log = logging.getLogger("shardcast.relay.gossip")
REANNOUNCE_S = 30.0
_SHARDCAST_SUFFIX = "/shardcast"


def coordinator_url_of(config: RelayConfig) -> str | None:
    if config.coordinator_url:
        return config.coordinator_url.rstrip("/")
    for upstream in config.upstreams:
        if upstream.rstrip("/").endswith(_SHARDCAST_SUFFIX):
            return upstream.rstrip("/")[: -len(_SHARDCAST_SUFFIX)]
    return None


def public_url_of(config: RelayConfig) -> str | None:
    if config.public_url:
        return config.public_url.rstrip("/")
    if config.port == 0 or config.host in ("0.0.0.0", "::", ""):
        return None
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{config.port}"


def newest_complete(relay: RelayMirror) -> int | None:
    complete = [version for version, mirrored in relay.versions.items() if mirrored.complete]
    return max(complete) if complete else None


async def announce_relay(gossip: Gossip, relay: RelayMirror, url: str, stop: asyncio.Event) -> None:
    """Announce ``url`` when the newest complete version changes and every REANNOUNCE_S."""
    announced: tuple[int | None, float] | None = None
    while not stop.is_set():
        latest = newest_complete(relay)
        if announced is None or announced[0] != latest or time.monotonic() - announced[1] >= REANNOUNCE_S:
            try:
                await asyncio.to_thread(gossip.announce, RelayAnnouncement(url=url, latest_version=latest))
                announced = (latest, time.monotonic())
            except PrimeError as exc:
                log.warning("could not announce this relay: %s", exc.message)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def run_relay_gossip(config: RelayConfig, relay: RelayMirror) -> None:
    """The relay on the gossip network until cancelled; does nothing when p2p is off or cannot start."""
    coordinator_url = coordinator_url_of(config)
    if config.p2p.enabled and (coordinator_url is None or relay.coordinator_id is None):
        log.info("p2p: no coordinator URL to join through (set coordinator_url); polling only")
        return
    loop = asyncio.get_running_loop()

    def on_policy(_accepted: Accepted) -> None:
        loop.call_soon_threadsafe(relay.wake.set)

    identity = load_or_create_identity(config.data_dir)
    gossip = await start_gossip(identity, config.p2p, relay.coordinator_id, {"policy_version": on_policy})
    if gossip is None or coordinator_url is None:
        return
    stop = asyncio.Event()  # never set: the relay ends this task by cancelling it
    url = public_url_of(config)
    jobs = [keep_joined(gossip, coordinator_url, stop)]
    if url is not None:
        jobs.append(announce_relay(gossip, relay, url, stop))
    else:
        log.info("p2p: this relay's URL is not known (host 0.0.0.0 or port 0; set public_url): not announcing it")
    try:
        await asyncio.gather(*jobs)
    finally:
        gossip.stop()
