"""A relay as a service: first-contact checks, the mirroring loop, gossip and the HTTP server together.

Kept apart from :mod:`shardcast.relay.mirror` (the mirror itself) so the gossip side
(:mod:`shardcast.relay.gossip`) can build on the mirror without an import cycle.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.errors import ConfigError
from runtime.first_contact import check_relays
from shardcast.http.server import create_app, run_event_loop, serve_http
from shardcast.relay.config import RelayConfig
from shardcast.relay.gossip import run_relay_gossip
from shardcast.relay.mirror import RelayMirror

log = logging.getLogger("shardcast.relay.mirror")


async def serve_relay(config: RelayConfig) -> None:
    """Run a relay until SIGINT/SIGTERM: the mirroring loop and the HTTP server side by side."""
    if not config.upstreams:
        raise ConfigError("a relay needs at least one upstream (--upstream URL)")
    if config.coordinator_id is None:
        raise ConfigError("a relay needs the coordinator's node id (--coordinator-id) to verify manifests")
    await check_relays(config.upstreams)
    relay = RelayMirror(config, config.coordinator_id)
    log.info("relay on http://%s:%d mirroring %s", config.host, config.port, ", ".join(relay.upstreams))

    async def background() -> None:
        await asyncio.gather(relay.run(), run_relay_gossip(config, relay))

    try:
        await serve_http(create_app(relay), config.host, config.port, background)
    finally:
        await relay.aclose()


def run_relay(config: RelayConfig) -> None:
    """`prime-relay serve`: :func:`serve_relay` on asyncio's own loop (:func:`shardcast.http.server.run_event_loop`)."""
    run_event_loop(lambda: serve_relay(config))
