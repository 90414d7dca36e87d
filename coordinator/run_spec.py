"""The coordinator's side of environment pinning: the signed run spec and the ledger's prompts.

At start-up the coordinator loads the ``[environment]`` (refusing, with one line, one it cannot
serve or whose rewards are not deterministic), renders its prompts with the start checkpoint's
tokenizer for the ledger, and signs a :class:`protocol.schemas.RunSpec` naming the environment's
identity. ``GET /v1/run-spec`` serves it; validators refuse to judge a run whose environment
they cannot load identically, and workers show it.
"""

from __future__ import annotations

from coordinator.config import CoordinatorConfig
from environments.loader import environment_identity, load_checked_environment
from environments.prompts import EnvironmentPrompts
from protocol.identity import NodeIdentity
from protocol.schemas import RunSpec, SignedRunSpec
from protocol.signing import sign_document


def run_spec(config: CoordinatorConfig) -> RunSpec:
    return RunSpec(run_name=config.run_name, environment=environment_identity(config.environment))


def signed_run_spec(config: CoordinatorConfig, identity: NodeIdentity) -> SignedRunSpec:
    spec = run_spec(config)
    return SignedRunSpec(
        spec=spec, signer=identity.node_id, signature_b64=sign_document(identity, spec.model_dump(mode="json"))
    )


def environment_prompts(config: CoordinatorConfig) -> EnvironmentPrompts:
    """The environment's prompts, rendered for the start checkpoint's tokenizer (checked at start-up)."""
    from transformers import AutoTokenizer

    from trainer.builtin import resolve_model_path

    environment = load_checked_environment(config.environment)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(config.policy.start_checkpoint)))
    return EnvironmentPrompts(environment, tokenizer)
