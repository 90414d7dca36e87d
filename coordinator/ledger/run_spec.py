"""The coordinator's side of environment pinning: the signed run spec and the ledger's prompts.

At start-up the coordinator loads the ``[environment]`` (refusing, with one line, one it cannot
serve or whose rewards are not deterministic), renders its prompts with the start checkpoint's
tokenizer for the ledger, and signs a :class:`protocol.schemas.RunSpec` naming the environment's
identity and the run's precision (:func:`run_precision`). ``GET /v1/run-spec`` serves it;
validators refuse to judge a run whose environment they cannot load identically, workers and
validators compute in its precision, and workers show it. A precision the validators have no
TOPLOC calibration for is refused before anything starts (:func:`check_precision`). A LoRA run's spec
pins its base (version 0) by hash and names the adapters' shape (:func:`lora_pin`). The audit policy
(:func:`coordinator.ledger.audit_policy.audit_policy`) is in the spec too: every worker can read the odds
its work is checked at; so is the training policy (:func:`coordinator.ledger.training_policy.training_policy`):
what the trainer trusts and refuses.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.ledger.audit_policy import audit_policy
from coordinator.ledger.training_policy import training_policy
from environments.base import Environment
from environments.episode import episode_turns
from environments.loader import environment_identity, load_checked_environment
from environments.prompts import EnvironmentPrompts, PromptSource, shows_images
from environments.render import ImageBlocks
from protocol.errors import ConfigError
from protocol.identity import NodeIdentity
from protocol.schemas import LoraPin, Precision, RunSpec, SignedRunSpec
from protocol.signing import sign_document
from toploc.calibrations import require_calibrated
from trainer.config import TrainerSection


def run_precision(config: CoordinatorConfig) -> Precision:
    """The run's precision: the configured one, or for `auto` bfloat16 with a CUDA GPU here and float32 without."""
    if config.precision != "auto":
        return config.precision
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def check_precision(config: CoordinatorConfig) -> Precision:
    """The run's precision; ConfigError (one line, with the fix) when validators have no calibration for it."""
    precision = run_precision(config)
    require_calibrated(precision)
    return precision


def trainer_section(config: CoordinatorConfig, model: str) -> TrainerSection:
    """``orchestrator.trainer`` for the run: from ``model``, publishing in the run's precision.

    The master weights stay in the section's dtype (float32 by default); the exported policies take the
    run's precision unless ``checkpoint.export_dtype`` is set, and a bfloat16 run on a CUDA machine computes
    in bf16 under FSDP2 (``parallel.param_dtype``) unless that is set."""
    import torch

    section = config.orchestrator.trainer
    precision = run_precision(config)
    checkpoint, parallel = section.checkpoint, section.parallel
    if "export_dtype" not in checkpoint.model_fields_set and precision in ("float32", "bfloat16"):
        checkpoint = checkpoint.model_copy(update={"export_dtype": precision})
    if precision == "bfloat16" and "param_dtype" not in parallel.model_fields_set and torch.cuda.is_available():
        parallel = parallel.model_copy(update={"param_dtype": "bfloat16"})
    return section.model_copy(update={"model": model, "checkpoint": checkpoint, "parallel": parallel})


def lora_pin(config: CoordinatorConfig) -> LoraPin | None:
    """A LoRA run's pin: the start checkpoint's hash (its version 0, the base) and the adapters' shape."""
    lora = config.orchestrator.trainer.lora
    if not lora.enabled:
        return None
    from shardcast.format.manifest import checkpoint_digest
    from trainer.resolve import resolve_model_path

    targets = [lora.target_modules] if isinstance(lora.target_modules, str) else list(lora.target_modules)
    base = resolve_model_path(config.policy.start_checkpoint)
    return LoraPin(base_hash=checkpoint_digest(base), rank=lora.rank, alpha=lora.alpha, target_modules=targets)


def run_spec(config: CoordinatorConfig, max_turns: int = 1, images: bool = False) -> RunSpec:
    """The run spec of ``config``, whose environment gives episodes of at most ``max_turns`` policy turns and, with
    ``images``, prompts that show images."""
    return RunSpec(
        run_name=config.run_name,
        environment=environment_identity(config.environment),
        precision=run_precision(config),
        max_turns=max_turns,
        lora=lora_pin(config),
        images=images,
        audit=audit_policy(config.validation),
        training=training_policy(config),
    )


def signed_run_spec(config: CoordinatorConfig, identity: NodeIdentity, prompts: PromptSource) -> SignedRunSpec:
    """The run spec of ``config`` and its ``prompts``, signed with the coordinator's key."""
    spec = run_spec(config, prompts.max_turns, prompts.shows_images)
    return SignedRunSpec(
        spec=spec, signer=identity.node_id, signature_b64=sign_document(identity, spec.model_dump(mode="json"))
    )


def vision_of(config: CoordinatorConfig, environment: Environment, checkpoint: Path) -> ImageBlocks | None:
    """How the start checkpoint writes an image in a prompt, for an environment that shows images (None for one
    that does not); ConfigError (one line, with the fix) when the run cannot show them, or when the local network
    would start a vLLM worker on a vision-language policy (its engine runs none)."""
    from engines.vision import VisionInputs

    vision = VisionInputs.of_checkpoint(checkpoint)
    local = config.local_network
    if vision is not None and local.enabled and "vllm" in local.engines:
        raise ConfigError(
            f"the start checkpoint {config.policy.start_checkpoint!r} is a vision-language policy, which vLLM "
            'workers do not run; set local_network.engines = ["hf"]'
        )
    if not shows_images(environment):
        return None
    where = f"the environment {environment.name!r} shows images with its prompts"
    if vision is None:
        raise ConfigError(
            f"{where}, and the start checkpoint {config.policy.start_checkpoint!r} reads text only; start from a "
            "vision-language checkpoint (e.g. policy.start_checkpoint = 'builtin:tiny-qwen2-vl')"
        )
    if episode_turns(environment) > 1:
        raise ConfigError(f"{where} and answers the policy over several turns; episodes with images are not run")
    if config.orchestrator.trainer.lora.enabled:
        raise ConfigError(f"{where}; LoRA runs train text-only policies: set orchestrator.trainer.lora.enabled = false")
    return vision


def environment_prompts(config: CoordinatorConfig) -> EnvironmentPrompts:
    """The environment's prompts, rendered for the start checkpoint's tokenizer (checked at start-up)."""
    from transformers import AutoTokenizer

    from trainer.resolve import resolve_model_path

    environment = load_checked_environment(config.environment)
    checkpoint = resolve_model_path(config.policy.start_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompts = EnvironmentPrompts(environment, tokenizer, vision_of(config, environment, checkpoint))
    # A tokenizer that cannot encode the environment's text gives empty prompts, which no task may carry:
    # refuse at start-up rather than fail every lease.
    if any(not prompt.token_ids for prompt in prompts.prompt_group(0, config.scheduling.prompts_per_task)):
        raise ConfigError(
            f"the environment {environment.name!r} gives prompts that the start checkpoint's tokenizer "
            f"({checkpoint}) encodes to no tokens; use a policy.start_checkpoint whose tokenizer covers its text"
        )
    return prompts
