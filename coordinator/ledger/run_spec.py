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
from protocol.errors import ConfigError
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

    from trainer.resolve import resolve_model_path

    environment = load_checked_environment(config.environment)
    checkpoint = resolve_model_path(config.policy.start_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompts = EnvironmentPrompts(environment, tokenizer)
    # A tokenizer that cannot encode the environment's text gives empty prompts, which no task may carry:
    # refuse at start-up rather than fail every lease.
    if any(not prompt.token_ids for prompt in prompts.prompt_group(0, config.scheduling.prompts_per_task)):
        raise ConfigError(
            f"the environment {environment.name!r} gives prompts that the start checkpoint's tokenizer "
            f"({checkpoint}) encodes to no tokens; use a policy.start_checkpoint whose tokenizer covers its text"
        )
    return prompts
