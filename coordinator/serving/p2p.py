"""The coordinator on the gossip network: its libp2p node, the public ``GET /v1/p2p``, and announcements.

:class:`CoordinatorGossip` runs a :class:`~runtime.p2p.gossip.Gossip` node next to the API
and a watcher thread that announces, signed with the coordinator key, each policy version the
ledger makes current (by :func:`coordinator.loop.policies.publish_policy`, whichever process ran it:
``prime-coordinator publish`` is a separate process, so the watcher reads the ledger rather
than waiting for an in-process call) and, when leases expire or are abandoned, the tasks that
wait to be leased again (so idle workers ask at once rather than at their next retry). The
watcher's check is one indexed ``SELECT max(version)`` every ``watch_interval_s``; a failure to
announce is logged and retried, never fatal, because nodes still learn everything by polling.
Relay announcements it accepts go to an optional listener (the dashboard's
:class:`~coordinator.serving.dashboard.relays.RelayWatch`).
"""

from __future__ import annotations

import logging
import threading
import time

from fastapi import FastAPI, Request

from coordinator.config import CoordinatorConfig
from coordinator.ledger.views import LedgerViews
from protocol import routes
from protocol.announcements import policy_announcement
from protocol.errors import NotFoundError, PrimeError, StartupError
from protocol.identity import NodeIdentity
from protocol.schemas import P2PInfo, TaskAnnouncement
from runtime.p2p.gossip import Gossip, Listener

log = logging.getLogger("coordinator.serving.p2p")
TASKS_REANNOUNCE_S = 30.0


class CoordinatorGossip:
    """The coordinator's gossip node and the thread that announces publications and tasks."""

    def __init__(
        self,
        identity: NodeIdentity,
        config: CoordinatorConfig,
        ledger: LedgerViews,
        origin_url: str | None,
        on_relay: Listener | None = None,
    ) -> None:
        self.gossip = Gossip(identity, config.p2p, identity.node_id)
        if on_relay is not None:
            self.gossip.on("relay", on_relay)
        self.ledger = ledger
        self.origin_url = origin_url
        self.watch_interval_s = config.p2p.watch_interval_s
        self.announced_version: int | None = None
        self._tasks_announced_at = 0.0
        self._had_tasks = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.gossip.start()
        self._thread = threading.Thread(target=self._watch, name="p2p-announcer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.gossip.stop()

    def _watch(self) -> None:
        last_tasks_check = 0.0
        while not self._stop.is_set():
            try:
                self.announce_new_version()
                if time.monotonic() - last_tasks_check >= 1.0:
                    last_tasks_check = time.monotonic()
                    self.announce_tasks()
            except PrimeError as exc:
                log.warning("gossip announcement failed (will retry): %s", exc.message)
            except Exception:
                log.exception("gossip announcement failed (will retry)")
            self._stop.wait(self.watch_interval_s)

    def announce_new_version(self) -> None:
        """Announce the ledger's newest policy version if it was not announced yet."""
        latest = self.ledger.latest_published()
        if latest is None or latest[0] == self.announced_version:
            return
        version, published_at = latest
        try:
            signed = self.ledger.manifest(version)
        except NotFoundError:
            return
        self.gossip.announce(policy_announcement(signed, self.origin_url, published_at))
        self.announced_version = version
        log.info(
            "announced policy v%d on gossip (%.3f s after its publication)",
            version,
            time.time() - published_at,
            extra={"policy_version": version, "published_at": published_at},
        )

    def announce_tasks(self) -> None:
        """Announce tasks waiting to be leased when some appear, and again every TASKS_REANNOUNCE_S while they wait."""
        num_open, version = self.ledger.waiting_tasks()
        had_tasks, self._had_tasks = self._had_tasks, num_open > 0
        if not self._had_tasks:
            return
        if had_tasks and time.monotonic() - self._tasks_announced_at < TASKS_REANNOUNCE_S:
            return
        self.gossip.announce(TaskAnnouncement(num_tasks_open=num_open, current_policy_version=version))
        self._tasks_announced_at = time.monotonic()


def mount_p2p_info(app: FastAPI, gossip: CoordinatorGossip | None) -> None:
    """``GET /v1/p2p``: the coordinator's peer id and multiaddrs (a wildcard bind host replaced by the host the
    asker reached the API by), or 404 when p2p is disabled."""

    @app.get(routes.P2P, tags=["public"])
    def p2p_info(request: Request) -> P2PInfo:
        if gossip is None:
            raise NotFoundError("p2p is disabled on this coordinator ([p2p] enabled = false); poll the ledger")
        # Bound to 0.0.0.0 without a public_host: the asker can dial us where it reached the API.
        return gossip.gossip.info(reached_as=request.url.hostname)


def start_coordinator_gossip(
    identity: NodeIdentity,
    config: CoordinatorConfig,
    ledger: LedgerViews,
    app: FastAPI,
    api_url: str,
    on_relay: Listener | None = None,
) -> CoordinatorGossip | None:
    """Start the coordinator's gossip (when enabled) and mount ``GET /v1/p2p`` either way.

    ``on_relay`` hears each accepted relay announcement (the dashboard's relay list).
    """
    gossip = None
    if config.p2p.enabled:
        public = not api_url.startswith(("http://0.0.0.0", "http://[::]"))
        origin_url = f"{api_url}/shardcast" if public else None
        gossip = CoordinatorGossip(identity, config, ledger, origin_url, on_relay)
        try:
            gossip.start()
        except StartupError:  # a port another node holds: the operator must choose, not run half-deaf
            gossip.stop()
            raise
        except Exception as exc:  # the run goes on: nodes learn new versions by polling
            log.error("the p2p node could not start (%r); gossip is off for this run", exc)
            gossip.stop()
            gossip = None
    mount_p2p_info(app, gossip)
    return gossip
