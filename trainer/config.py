"""Configs of `prime-trainer sft`, `prime-trainer rl` and `prime-trainer eval`.

The sections (optimizer, parallelism, loss, packing, checkpointing) are shared by the SFT and
RL configs; the coordinator embeds :class:`TrainerSection` in its own run config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from environments.config import BuiltinEnvConfig, EnvironmentConfig
from runtime.config import RoleConfig, Section


class OptimizerConfig(Section):
    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay of AdamW."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (beta1, beta2)."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW's epsilon."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global norm."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up from 0 to `lr` over this many steps."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After warm-up: constant, cosine decay or linear decay to `min_lr_ratio * lr` at the last step."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Floor of the decaying schedules, as a fraction of `lr`."""


class ParallelConfig(Section):
    """FSDP2 settings; they apply when the trainer runs under torchrun (WORLD_SIZE set)."""

    param_dtype: Literal["float32", "bfloat16"] | None = None
    """FSDP2 MixedPrecisionPolicy compute dtype of parameters (None: the model's dtype)."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of gradient reduce-scatter."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after forward (ZeRO-3); False keeps them until backward (ZeRO-2)."""
    activation_checkpointing: bool = False
    """Recompute each decoder block's activations in backward: less memory, about a third more compute."""


class PackingConfig(Section):
    micro_batch_tokens: int = Field(default=4096, ge=16)
    """Tokens (padding included) per micro-batch; one forward/backward each, gradients accumulated."""
    row_tokens: int = Field(default=128, ge=16)
    """Packed row width: samples are concatenated into rows of at most this many tokens (or the longest sample).

    Attention costs O(width^2) per row on CPU whatever the mask hides, so narrow rows win there;
    on GPUs with a varlen attention kernel, set it to micro_batch_tokens.
    """
    enabled: bool = True
    """False pads each sample to the longest of its micro-batch instead (the baseline the bench compares)."""


class LossConfig(Section):
    """The GRPO-family policy loss with a bounded off-policy correction.

    Tokens are weighted by the importance ratio r = pi_trainer / pi_inference of the sampled
    token. `correction = "clip"` (default) is PPO's two-sided clip with a dual-clip cap on
    negative advantages (INTELLECT-2's choice): a token whose ratio already moved the way its
    advantage asks past the clip stops pulling, and one that moved the other way keeps the gradient
    that brings it back, its weight bounded. `correction = "mask"` drops every token whose ratio
    left [1 - mask_low, 1 + mask_high] and keeps the plain ratio-weighted gradient for the others
    (prime-rl's choice against engine mismatch); with a policy one step stale it also drops the
    tokens the last update moved the wrong way, which then go uncorrected: on an exact-answer task
    (sort_digits, async level 1) it took the held-out accuracy from 0.34 down to 0.15 in 10 steps,
    where clip took it up to 0.60 in 15.
    """

    correction: Literal["mask", "clip"] = "clip"
    """How tokens with a far-off importance ratio are bounded: clipped ("clip") or dropped ("mask")."""
    mask_low: float = Field(default=0.2, ge=0, lt=1)
    """mask: tokens with ratio < 1 - mask_low are dropped."""
    mask_high: float = Field(default=0.2, ge=0)
    """mask: tokens with ratio > 1 + mask_high are dropped."""
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """clip: PPO lower clip epsilon."""
    clip_high: float = Field(default=0.28, ge=0)
    """clip: PPO upper clip epsilon."""
    clip_ratio_max: float = Field(default=4.0, gt=1)
    """clip: for negative advantages the ratio weight is capped at this (dual clip)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of a k3 KL penalty towards the sampling policy's logprobs (0: off)."""
    behaviour_logprobs: Literal["auto", "recompute", "sampler"] = "auto"
    """Where the ratio's denominator, each trained token's log-probability under the policy that sampled it, comes
    from. `recompute`: the trainer computes it with the weights of the version that sampled the token, which it
    keeps in memory (async_level + 1 versions of the trained parameters; an extra forward per older version present
    in a step's batch); no number a worker declared enters the loss. `sampler`: the number the sampling engine
    reported; in a network run only on samples a validator recomputed and found within tolerance (the others are not
    trained), and the ratio band and mismatch KL breakers trip on the policy's own drift at a high learning rate.
    `auto`: `recompute` in a network run; `sampler` in the local RL loop (its engine is the trainer's own)."""


class BreakerConfig(Section):
    """Checks of a step's update before `optimizer.step()`: a step that trips one is not applied (model, optimizer
    and schedule untouched), and a network run sends its groups to a full re-audit (docs/trust-model.md)."""

    enabled: bool = True
    """Check every step (false: apply every step, as trainers without breakers do)."""
    grad_norm_ceiling: float = Field(default=100.0, gt=0)
    """Trip on a pre-clip global gradient norm above this (clipping at `optimizer.max_grad_norm` still applies
    below it)."""
    grad_norm_median_factor: float = Field(default=10.0, gt=1)
    """Trip on a pre-clip gradient norm above this many times the median of the last applied steps' norms."""
    median_steps: int = Field(default=20, ge=1, le=10_000)
    """Applied steps the running median is taken over."""
    median_min_steps: int = Field(default=5, ge=1, le=10_000)
    """The median rule applies once this many steps were applied (a run's first steps have no history)."""
    ratio_band: tuple[float, float] = (0.5, 2.0)
    """The band of importance ratios (the trainer's probability of a trained token over its behaviour
    probability) a step's tokens are expected in."""
    max_out_of_band_fraction: float = Field(default=0.1, ge=0, le=1)
    """Trip when more than this share of the step's trained tokens have a ratio outside `ratio_band`, where the
    behaviour log-probabilities are the sampling engine's (`loss.behaviour_logprobs` `sampler`). Recomputed by the
    trainer, the share only measures how far the policy moved since older versions drew: reported, never tripped."""
    max_mismatch_kl: float = Field(default=0.5, gt=0)
    """Trip when the mean k3 KL between the behaviour log-probabilities and the trainer's, per trained token,
    is above this (as the band: only where the behaviour numbers are the sampling engine's)."""
    draw_tolerance: float | None = Field(default=None, ge=0)
    """With behaviour log-probabilities recomputed, replay every trained token's seeded draw and trip when one's
    noisy score is more than this below the best (it was not this policy's draw). Empty: a network run uses the
    run precision's calibrated sampling tolerance (the validators'); elsewhere no replay."""

    @model_validator(mode="after")
    def _check_band(self) -> BreakerConfig:
        low, high = self.ratio_band
        if not 0 <= low < 1 < high:
            raise ValueError(f"ratio_band must be (low, high) with 0 <= low < 1 < high, not {self.ratio_band}")
        return self


class CheckpointConfig(Section):
    interval_steps: int = Field(default=0, ge=0)
    """Save the full trainer state every this many steps (0: only at the end)."""
    export_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the exported HF policy weights."""
    keep: int = Field(default=2, ge=1, le=1000)
    """Trainer checkpoints kept (the newest); older ones are deleted after each save. The newest is what a
    restart resumes from; a second one is a spare."""


class LoraConfig(Section):
    """Low-rank adapters (PEFT LoRA) in place of full-weight training: the base weights stay frozen, only the
    adapters train, and a network run publishes each version as an adapter (a few MB) instead of the weights."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight."""
    rank: int = Field(default=16, ge=1, le=1024)
    """Rank r of each adapter (A is r x in, B is out x r)."""
    alpha: float = Field(default=32.0, gt=0)
    """Scale numerator: an adapter adds (alpha / rank) * B @ A to its weight."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input in training (0 keeps the trainer's logprobs those the engines compute)."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Which linear layers get an adapter: `all-linear` (every attention and MLP projection, never the output
    head), or module name suffixes such as `["q_proj", "v_proj"]`."""


class TrainerSection(Section):
    """What a trainer needs, whatever drives it (SFT loop, RL loop, the coordinator)."""

    model: str = "builtin:tiny-qwen2"
    """A local HF checkpoint directory, a Hugging Face hub id (`ORG/NAME[@REVISION]`, through the HF cache), or
    `builtin:tiny-qwen2` (made by our code, no download)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the master weights and optimizer state: keep float32 (bf16 compute on GPUs is
    `parallel.param_dtype`, which a coordinator's bfloat16 run sets); bf16 on CPUs is 20-30x slower."""
    seed: int = 0
    """Seeds torch and python RNGs (and the data order)."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW and its learning-rate schedule (warm-up steps, decay, gradient clipping)."""
    parallel: ParallelConfig = ParallelConfig()
    """FSDP2 sharding under torchrun: parameter and reduce dtypes, resharding, activation checkpointing."""
    packing: PackingConfig = PackingConfig()
    """How samples are packed into rows and micro-batches (tokens per micro-batch, row width)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often the full trainer state is saved, how many saves are kept, the exported weights' dtype (in a
    coordinator's run: the run's precision, unless set)."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full-weight training (off by default)."""
    freeze_vision: bool = True
    """A vision-language model's image encoder (Qwen2-VL's `visual`, its merger into the text model included) keeps
    its start weights and only the text model trains; false trains it too. Text-only models have none to freeze."""


class SftConfig(RoleConfig):
    model_config = SettingsConfigDict(env_prefix="PRIME_TRAINER_")

    model: str = "builtin:tiny-qwen2"
    """A local HF checkpoint directory, a Hugging Face hub id (`ORG/NAME[@REVISION]`, through the HF cache), or
    `builtin:tiny-qwen2` (made by our code, no download)."""
    environment: EnvironmentConfig = BuiltinEnvConfig()
    """The SFT data: the environment's prompts and reference answers (the [environment] section)."""
    output_dir: Path = Path("runs/sft")
    """Checkpoints, metrics.jsonl and the exported HF policy (output_dir/policy) go here."""
    num_steps: int = Field(default=300, ge=1)
    """Optimizer steps."""
    batch_size: int = Field(default=32, ge=1)
    """Prompt/completion pairs per optimizer step."""
    seed: int = 0
    """Seeds torch and python RNGs."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """float32 on CPUs (bf16 is 20-30x slower there); bfloat16 on GPUs."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW and its learning-rate schedule (warm-up steps, decay, gradient clipping)."""
    parallel: ParallelConfig = ParallelConfig()
    """FSDP2 sharding under torchrun: parameter and reduce dtypes, resharding, activation checkpointing."""
    packing: PackingConfig = PackingConfig()
    """How samples are packed into rows and micro-batches (tokens per micro-batch, row width)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often the full trainer state is saved, how many saves are kept, the exported weights' dtype."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full-weight training (off by default): output_dir/policy is then the adapter,
    and output_dir/merged the base with the adapter folded in."""
    freeze_vision: bool = True
    """A vision-language model's image encoder keeps its start weights (false: it trains too, as a start
    checkpoint's SFT from random weights needs)."""
    resume: bool = True
    """Continue from the latest trainer state in output_dir/checkpoints when there is one."""
    wandb_project: str | None = None
    """Also log metrics to this W&B project (needs the wandb package; JSONL is always written)."""
    eval_examples: int = Field(default=64, ge=0)
    """Held-out check after training: teacher-forced completion loss on this many eval pairs (0: skip)."""

    def trainer_section(self) -> TrainerSection:
        return TrainerSection(
            model=self.model,
            dtype=self.dtype,
            seed=self.seed,
            optimizer=self.optimizer,
            parallel=self.parallel,
            packing=self.packing,
            checkpoint=self.checkpoint,
            lora=self.lora,
            freeze_vision=self.freeze_vision,
        )


class RlConfig(RoleConfig):
    """A local RL run: trainer and one engine in a loop, synchronous (the network runs it async)."""

    model_config = SettingsConfigDict(env_prefix="PRIME_TRAINER_")

    trainer: TrainerSection = TrainerSection()
    """The model to train (and its dtype, seed), optimizer, parallelism, packing and checkpoint settings."""
    environment: EnvironmentConfig = BuiltinEnvConfig()
    """Where prompts and rewards come from (the [environment] section, as every role reads it)."""
    output_dir: Path = Path("runs/rl")
    """Checkpoints, metrics.jsonl and exported policies go here."""
    num_steps: int = Field(default=100, ge=1)
    """RL steps (one optimizer step each)."""
    prompts_per_step: int = Field(default=32, ge=1)
    """Distinct prompts per step."""
    group_size: int = Field(default=8, ge=2)
    """Samples per prompt (the GRPO group)."""
    max_tokens: int = Field(default=32, ge=1)
    """Generation budget per sample."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; the trainer computes logprobs at the same temperature."""
    normalize_std: bool = False
    """Divide group advantages by the group's reward std (original GRPO)."""
    loss: LossConfig = LossConfig()
    """The GRPO-family policy loss: how off-policy tokens are masked or clipped, and the KL weight."""
    eval_examples: int = Field(default=128, ge=0)
    """Size of the fixed eval set whose sampled reward is reported every `eval_interval_steps`."""
    eval_interval_steps: int = Field(default=10, ge=0)
    """0: evaluate only before and after training."""
    engine: Literal["hf"] = "hf"
    """Inference engine that generates the rollouts (through the Engine interface)."""
    resume: bool = True
    """Continue from the latest trainer state in output_dir/checkpoints when there is one."""
    wandb_project: str | None = None
    """Also log metrics to this W&B project (needs the wandb package; JSONL is always written)."""

    @model_validator(mode="after")
    def _group_fits_streams(self) -> RlConfig:
        if self.group_size > 1 << 16:
            raise ValueError("group_size must be below 65536 (toploc.sampling.MAX_GROUP_STREAMS)")
        return self


class EvalConfig(RoleConfig):
    model_config = SettingsConfigDict(env_prefix="PRIME_TRAINER_")

    model: str = "builtin:tiny-qwen2"
    """HF checkpoint directory (or built-in name) to evaluate, or a LoRA adapter directory (evaluated on the base
    its adapter_config.json names)."""
    environment: EnvironmentConfig = BuiltinEnvConfig()
    """The environment whose eval set is run (the [environment] section, as every role reads it)."""
    num_examples: int = Field(default=128, ge=1)
    """Size of the eval set (the first examples of the environment's eval stream)."""
    num_samples: int = Field(default=1, ge=1)
    """Samples per eval prompt."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature (verifiable sampler; T > 0)."""
    max_tokens: int = Field(default=32, ge=1)
    """Generation budget per sample."""
    seed: int = 0
    """Sampling seed."""
    engine: Literal["hf"] = "hf"
    """Inference engine."""
    batch_size: int = Field(default=256, ge=1)
    """Requests per engine.generate call."""
