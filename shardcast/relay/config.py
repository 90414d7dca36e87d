"""The relay's config (`prime-relay serve`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from protocol.errors import IdentityError
from protocol.identity import public_key_from_node_id
from runtime.config import RoleConfig
from runtime.p2p.config import P2PConfig


class RelayConfig(RoleConfig):
    model_config = SettingsConfigDict(env_prefix="PRIME_RELAY_")

    host: str = "127.0.0.1"
    """Interface to serve on; 0.0.0.0 to serve other machines."""
    port: int = Field(default=8100, ge=0, le=65535)
    """TCP port to serve on (0 picks a free one)."""
    upstreams: list[str] = Field(default_factory=list)
    """Origin or relay URLs to mirror from (at least one to serve)."""
    coordinator_id: str | None = None
    """Node id whose manifest signatures are trusted; required to serve anything."""
    data_dir: Path = Path.home() / ".prime-network" / "relay"
    """Where mirrored versions are kept."""
    poll_interval_s: float = Field(default=2.0, gt=0)
    """How often upstreams are asked for new versions."""
    keep_versions: int = Field(default=3, ge=1)
    """How many policy versions to keep on disk (older ones still being served are kept until idle)."""
    in_use_s: float = Field(default=60.0, ge=0)
    """An older version whose manifest or shard was served this recently is still in use: pruning waits."""
    num_parallel: int = Field(default=8, ge=1, le=256)
    """Shards fetched from upstreams at the same time."""
    shard_wait_s: float = Field(default=10.0, ge=0)
    """How long a request for a shard still being mirrored is held before it is answered 503."""
    min_rate_bps: float = Field(default=32 * 1024, ge=0)
    """Slowest shard or manifest body rate accepted from an upstream (bytes/s over 10 s); 0: no floor."""
    hedge_after_s: float = Field(default=1.5, gt=0)
    """A fetch from an upstream still running after this long is also asked of another upstream."""
    upstream_ban_s: float = Field(default=300.0, ge=0)
    """An upstream that sent a bad manifest or corrupt shard is not used for this long."""
    local_fault_retry_s: float = Field(default=30.0, gt=0)
    """After a local disk fault (full, read-only, permissions) mirroring pauses this long before trying again."""
    coordinator_url: str | None = None
    """Coordinator whose gossip network to join (via its GET /v1/p2p); unset: the upstream ending in /shardcast."""
    public_url: str | None = Field(default=None, pattern=r"^https?://")
    """The relay's URL as announced on gossip; unset: http://host:port (nothing is announced for 0.0.0.0 or port 0)."""
    p2p: P2PConfig = P2PConfig()
    """The libp2p gossip network: mirror announced versions at once and announce this relay's address."""

    @field_validator("coordinator_id")
    @classmethod
    def _a_real_node_id(cls, value: str | None) -> str | None:
        """An empty or placeholder id would start a relay that refuses every manifest while it looks healthy."""
        if value is None:
            return None
        try:
            public_key_from_node_id(value.strip())
        except IdentityError as exc:
            raise ValueError(
                f"{value!r} is not a coordinator node id ({exc.message}); copy the id the coordinator prints at "
                "start, or `prime-coordinator keys show -c RUN.toml` on the coordinator"
            ) from None
        return value.strip()
