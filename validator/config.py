"""The validator's config (`prime-validator run`), its ``[toploc]`` proof thresholds included."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from environments.config import EnvironmentConfig
from protocol.schemas import LONG_POLL_S, MAX_LONG_POLL_S
from runtime.config import RoleConfig
from runtime.p2p.config import P2PConfig
from toploc.config import ToplocConfig


class ValidatorConfig(RoleConfig):
    model_config = SettingsConfigDict(env_prefix="PRIME_VALIDATOR_")

    coordinator_url: str = "http://127.0.0.1:8000"
    """Base URL of the coordinator's ledger API."""
    coordinator_id: str | None = None
    """Node id of the coordinator whose manifests to trust; learned and pinned on first contact when unset."""
    relays: list[str] = Field(default_factory=list)
    """Extra SHARDCAST relay URLs for policy weights."""
    engine: Literal["hf"] = "hf"
    """Engine of the prefill re-computation: HF transformers, the only one a validator runs (rollouts that vLLM
    workers generated verify by an HF prefill), in the run's precision."""
    data_dir: Path = Path.home() / ".prime-network" / "validator"
    """Node key and downloaded policy versions."""
    first_contact_timeout_s: float = Field(default=60.0, ge=0)
    """How long to keep trying a coordinator that does not answer at start before exiting with an error."""
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    """Most sequences recomputed in one prefill batch."""
    max_versions: int = Field(default=3, ge=1)
    """Policy versions kept loaded (and on disk) at once: async_level + 1 is enough."""
    max_submissions_per_batch: int = Field(default=16, ge=1, le=256)
    """Pending submissions fetched at once; those of one policy version share one prefill batch."""
    gather_s: float = Field(default=1.0, ge=0, le=60)
    """After a batch in which under half of the samples were recomputed (the low shares of an adaptive audit), how
    long to wait before asking for the next: submissions gather into fuller prefill batches, each with its fixed
    cost, for verdicts up to this much later. A full audit or a full list (`max_submissions_per_batch`) never
    waits; 0: ask at once."""
    summary_interval_s: float = Field(default=10.0, gt=0)
    """How often a progress summary is logged."""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """How often to ask the ledger for pending submissions when idle and it does not long-poll."""
    long_poll_s: float = Field(default=LONG_POLL_S, ge=0, le=MAX_LONG_POLL_S)
    """How long a request for pending submissions, when there are none, waits at the ledger for one (a long-poll:
    a submission is audited when it arrives, not at the next poll); 0 asks every `poll_interval_s`."""
    environment: EnvironmentConfig | None = None
    """The environment whose rewards this validator recomputes; unset: the one the run spec names. Either way
    it must match the run spec (kind, arguments, package version), or the validator refuses to start."""
    p2p: P2PConfig = P2PConfig()
    """The libp2p gossip network: announced policy versions are downloaded before the first submission needs them."""
    toploc: ToplocConfig = ToplocConfig()
    """When a rollout's TOPLOC proof, sampled tokens and logprobs pass (docs/toploc.md). Unset thresholds come
    from the calibration of the run's precision and the submission's engine (toploc/calibration/); the ones set
    here override it. Its proof layout (chunk_size, topk) must stay the one workers build."""

    @model_validator(mode="after")
    def _check_proof_layout(self) -> ValidatorConfig:
        layout = ToplocConfig()
        for key in ("chunk_size", "topk"):
            value, built = getattr(self.toploc, key), getattr(layout, key)
            if value != built:
                raise ValueError(
                    f"toploc.{key} is {value}, but workers build proofs with {key} = {built}, so every honest proof "
                    f"would be rejected: remove {key} from [toploc] (only the thresholds are the validator's to set)"
                )
        return self
