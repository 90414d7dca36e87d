"""The ``[p2p]`` config section shared by every role that joins the gossip network."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from runtime.config import Section


class P2PConfig(Section):
    enabled: bool = True
    """Join the libp2p gossip network; when false (`--no-p2p`) the node learns everything by HTTP polling."""
    host: str = "127.0.0.1"
    """Interface the libp2p TCP listener binds; 0.0.0.0 to accept peers from other machines."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port of the libp2p listener (0 picks a free one)."""
    public_host: str | None = Field(default=None, max_length=253)
    """IP or DNS name put in the advertised multiaddrs instead of the bind address. Unset with host 0.0.0.0, the
    coordinator's ``GET /v1/p2p`` names the host each node reached its API by."""
    peers: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=64)
    """Extra peers to dial at start-up, as multiaddrs ending in /p2p/<peer id> (the coordinator is dialed anyway)."""
    max_announcement_age_s: float = Field(default=60.0, gt=0, le=3600)
    """Announcements sent longer ago than this (or this far in the future) are dropped as stale."""
