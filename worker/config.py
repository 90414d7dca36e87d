"""The worker's config (`prime-worker join`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from protocol.schemas import LONG_POLL_S, MAX_LONG_POLL_S
from runtime.config import RoleConfig
from runtime.p2p.config import P2PConfig


class WorkerConfig(RoleConfig):
    """What a contributor sets; everything else comes from the coordinator."""

    model_config = SettingsConfigDict(env_prefix="PRIME_WORKER_")

    coordinator_url: str = "http://127.0.0.1:8000"
    """Base URL of the coordinator's ledger API."""
    coordinator_id: str | None = None
    """Node id of the coordinator whose signatures to trust; learned and pinned on first contact when unset."""
    also_join: list[str] = Field(default_factory=list, max_length=8)
    """Coordinator URLs of more runs to work for at once. They must be LoRA runs on the same base as the first (one
    base hash, one precision): the engines hold the base once and serve each run's adapter; each run's coordinator
    id is learned and pinned on first contact."""
    relays: list[str] = Field(default_factory=list)
    """Extra SHARDCAST relay URLs to download policy weights from (the coordinator also announces relays)."""
    origin_fallback_enabled: bool = True
    """Also download policy weights from the coordinator's own origin (`<coordinator_url>/shardcast`)."""
    gpu: str = "all"
    """`all`, `none`, or a comma-separated list of GPU indices; one engine per selected GPU."""
    engine: Literal["auto", "vllm", "hf"] = "auto"
    """Inference engine; `auto` picks vLLM when it is installed, else HF transformers."""
    data_dir: Path = Path.home() / ".prime-network" / "worker"
    """Node key, downloaded policy versions, state."""
    first_contact_timeout_s: float = Field(default=60.0, ge=0)
    """How long to keep trying a coordinator that does not answer at start before exiting with an error."""
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    """Most sequences generated at once per engine."""
    vllm_cpu_compile: bool = False
    """Compile vLLM's model with torch inductor on a CPU: about 42 s more at start on 2 idle cores (minutes beside a
    busy trainer) for about 17% faster generation of a small model; worth it for long runs. GPUs always compile."""
    long_poll_s: float = Field(default=LONG_POLL_S, ge=0, le=MAX_LONG_POLL_S)
    """How long a lease request with nothing to lease waits at the ledger for a task (a long-poll: the worker
    hears of a new policy version when it is published, not at its next retry); 0 asks and retries later."""
    p2p: P2PConfig = P2PConfig()
    """The libp2p gossip network: announced policy versions are fetched at once (polling stays the fallback)."""

    @field_validator("gpu")
    @classmethod
    def _check_gpu(cls, value: str) -> str:
        if value in ("all", "none") or all(part.strip().isdigit() for part in value.split(",")):
            return value
        raise ValueError("gpu must be 'all', 'none' or a list of indices such as '0,1'")
