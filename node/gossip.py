"""What a worker does with gossip: fetch announced policy versions at once, learn relays, wake on tasks.

Announcements arrive in the libp2p thread already checked (signed by the pinned coordinator,
fresh, newer than the last); :class:`WorkerGossipHandler` hands each to the worker's asyncio
loop. A new policy version starts downloading through the worker's
:class:`~shardcast.client.cache.WeightsCache` immediately (retrying while relays are still mirroring
it), so the engine can switch as soon as the first task of that version is leased; a relay's
address (authentic but untrusted: every shard is still checked against the signed manifest)
joins the relays downloads are spread over, up to a cap; task availability wakes an idle task
loop. A version older than one the node holds or fetches is not prefetched: a (re)joining node
hears the last minute of announcements again. Nothing here replaces polling: leases still carry
the version each task needs.
"""

from __future__ import annotations

import asyncio
import logging
import time

from node.retry import sleep_unless_stopped
from protocol.announcements import Accepted, Kind
from protocol.errors import NotFoundError, RemoteUnavailableError
from protocol.identity import NodeIdentity
from protocol.schemas import PolicyAnnouncement, RelayAnnouncement
from runtime.p2p.config import P2PConfig
from runtime.p2p.gossip import Listener, keep_joined, start_gossip
from shardcast.client.cache import WeightsCache

log = logging.getLogger("node.gossip")
MAX_LEARNED_RELAYS = 16
FETCH_RETRY_S = 60.0


class WorkerGossipHandler:
    """Turns accepted announcements into downloads, relays and wake-ups on the node's asyncio loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        weights: WeightsCache,
        stop: asyncio.Event,
        work_available: asyncio.Event | None = None,
    ) -> None:
        self.loop = loop
        self.weights = weights
        self.stop = stop
        self.work_available = work_available
        self.learned_relays: list[str] = []
        self.fetches: dict[int, asyncio.Task[None]] = {}

    def listeners(self) -> dict[Kind, Listener]:
        def hand_over(accepted: Accepted) -> None:
            self.loop.call_soon_threadsafe(self.handle, accepted)

        return {"policy_version": hand_over, "relay": hand_over, "tasks": hand_over}

    def handle(self, accepted: Accepted) -> None:
        body = accepted.body
        if isinstance(body, PolicyAnnouncement):
            self.fetch_announced(body)
        elif isinstance(body, RelayAnnouncement):
            self.learn_relay(body.url)
        elif self.work_available is not None:
            self.work_available.set()

    def fetch_announced(self, announcement: PolicyAnnouncement) -> None:
        version = announcement.version
        known = [*self.weights.held_versions(), *self.fetches]
        if version in known:
            return
        if known and version < max(known):
            # A node that (re)joins hears the announcements of the last minute again, oldest among them:
            # prefetching those would race the pruning of old versions for nothing (a lease that needs an
            # older version fetches it then).
            log.debug("ignoring announced policy v%d: v%d is newer", version, max(known))
            return
        log.info(
            "policy v%d announced by gossip; fetching it now",
            version,
            extra={"policy_version": version, "published_at": announcement.published_at, "p2p_event": "fetch_start"},
        )
        self.fetches[version] = asyncio.create_task(self._fetch(version, time.monotonic()))

    async def _fetch(self, version: int, started: float) -> None:
        delay = 0.2
        while not self.stop.is_set():
            try:
                await self.weights.ensure(version)
            except (NotFoundError, RemoteUnavailableError) as exc:  # relays may still be mirroring it
                if time.monotonic() - started > FETCH_RETRY_S:
                    log.warning("gave up prefetching announced policy v%d: %s", version, exc.message)
                    return
                await sleep_unless_stopped(self.stop, delay)
                delay = min(delay * 2, 5.0)
                continue
            except Exception as exc:  # e.g. an IntegrityError: the task loop will fetch (and report) again
                log.warning("prefetch of announced policy v%d failed: %r", version, exc)
                return
            log.info(
                "fetched announced policy v%d in %.2f s",
                version,
                time.monotonic() - started,
                extra={"policy_version": version, "p2p_event": "fetch_done"},
            )
            return

    def learn_relay(self, url: str) -> None:
        url = url.rstrip("/")
        if url in self.weights.relays:
            return
        if len(self.learned_relays) >= MAX_LEARNED_RELAYS:
            log.debug("ignoring announced relay %s: already %d learned", url, MAX_LEARNED_RELAYS)
            return
        self.learned_relays.append(url)
        self.weights.relays.append(url)
        log.info("learned relay %s from gossip", url)

    async def aclose(self) -> None:
        for task in self.fetches.values():
            task.cancel()
        await asyncio.gather(*self.fetches.values(), return_exceptions=True)


async def run_node_gossip(
    config: P2PConfig,
    coordinator_url: str,
    identity: NodeIdentity,
    coordinator_id: str,
    weights: WeightsCache,
    stop: asyncio.Event,
    work_available: asyncio.Event | None = None,
) -> None:
    """A worker (or validator) on the gossip network until ``stop`` is set or this task is cancelled.

    Never raises; does nothing when p2p is disabled or cannot start: polling the ledger then
    does the job alone. ``work_available`` is set when the coordinator announces open tasks.
    """
    handler = WorkerGossipHandler(asyncio.get_running_loop(), weights, stop, work_available)
    gossip = await start_gossip(identity, config, coordinator_id, handler.listeners())
    try:
        if gossip is not None:
            await keep_joined(gossip, coordinator_url, stop)
    finally:
        await handler.aclose()
        if gossip is not None:
            gossip.stop()  # blocking but quick; also runs when cancelled, where awaiting is not allowed
