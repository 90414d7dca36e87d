"""The trainer: one optimizer step over a batch of samples, whatever the objective (RL or SFT).

:class:`Trainer` owns the (FSDP2-sharded) model, AdamW, the LR schedule and the step count.
:meth:`Trainer.train_step` packs the batch into micro-batches, deals them to ranks, runs
forward/backward on each with gradients accumulated (synchronised across ranks only on the
last), clips the global gradient norm, steps the optimizer and the schedule, and returns the
step's metrics. Every rank is given the *same* full batch and takes its own share, so the
orchestrator hands all ranks one file. The loss is a sum over tokens divided by the number
of loss tokens of the whole batch, so the update does not depend on how the batch was split
into micro-batches or ranks. A vision-language model (a checkpoint with an image processor) also
takes each sample's images (:mod:`trainer.packing`), its vision tower frozen unless the config says
otherwise (:mod:`trainer.vision`).

The RL entry point the orchestrator drives is :meth:`Trainer.rl_step`; SFT uses
:meth:`Trainer.sft_step`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint import (
    TrainerState,
    export_adapter,
    export_policy,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainer.config import LossConfig, TrainerSection
from trainer.fsdp import DistInfo, all_reduce_sum, init_distributed, shard_model
from trainer.lora import apply_lora, trainable_parameters
from trainer.loss import LossSums, grpo_loss, sft_loss, token_logprobs_and_entropy
from trainer.model import load_model, load_tokenizer, load_vision_inputs
from trainer.optim import build_optimizer, build_scheduler
from trainer.packing import MicroBatch, VisionPacking, deal_to_ranks, empty_micro_batch, make_micro_batches
from trainer.transport import TrainSample
from trainer.vision import freeze_vision_tower, sample_positions

log = logging.getLogger("trainer")

Objective = Callable[[MicroBatch, torch.Tensor], LossSums]
"""Per micro-batch: (batch, trainer logprobs of its targets, flat) -> loss sums."""


def sft_objective(batch: MicroBatch, logprobs: torch.Tensor) -> LossSums:
    mask = batch.loss_mask.reshape(-1).to(logprobs.device)
    zero = torch.zeros((), device=logprobs.device)
    return LossSums(loss=sft_loss(logprobs, mask), num_tokens=mask.sum(), num_dropped=zero, mismatch_kl=zero)


def grpo_objective(config: LossConfig) -> Objective:
    def objective(batch: MicroBatch, logprobs: torch.Tensor) -> LossSums:
        device = logprobs.device
        return grpo_loss(
            logprobs,
            batch.inference_logprobs.reshape(-1).to(device),
            batch.advantages.reshape(-1).to(device),
            batch.loss_mask.reshape(-1).to(device),
            config,
        )

    return objective


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Model, optimizer, schedule and step of one training run, on this rank.

    Build it on every rank (under torchrun it joins the process group and shards the model);
    then call :meth:`rl_step` or :meth:`sft_step` with the same full batch on every rank,
    :meth:`export` to publish the policy, :meth:`save` / :meth:`resume` for exact restarts.
    ``num_steps`` sizes the LR schedule.
    """

    def __init__(self, config: TrainerSection, num_steps: int, info: DistInfo | None = None) -> None:
        self.config = config
        self.num_steps = num_steps
        self.info = info or init_distributed()
        seed_everything(config.seed)
        if self.info.is_main:
            # Build a built-in model once, before the other ranks look for it.
            load_tokenizer(config.model)
        if self.info.is_distributed:
            torch.distributed.barrier()
        self.tokenizer = load_tokenizer(config.model)
        model = load_model(config.model, config.dtype)
        self.vision = load_vision_inputs(config.model)
        """The policy's image inputs; None for a text-only policy."""
        if config.lora.enabled:  # adapters on the unsharded model, then FSDP2 shards base and adapters alike
            model = apply_lora(model, config.lora, config.model)
        self.vision_packing: VisionPacking | None = None
        if self.vision is not None:
            self.vision_packing = VisionPacking(self.vision, sample_positions(model))
            if config.freeze_vision:  # after LoRA, so adapters PEFT put in the tower stay off too
                log.info("vision tower frozen (%d parameters)", freeze_vision_tower(model))
        self.model = shard_model(model, config.parallel, self.info)
        self.optimizer = build_optimizer(self.model, config.optimizer)
        self.scheduler = build_scheduler(self.optimizer, num_steps, config.optimizer)
        self.step = 0

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else 0

    def _micro_batches(self, samples: list[TrainSample]) -> tuple[list[MicroBatch], list[MicroBatch]]:
        """All micro-batches of the batch, and this rank's share (same count on every rank)."""
        packing = self.config.packing
        micro_batches = make_micro_batches(
            samples, packing.micro_batch_tokens, packing.enabled, packing.row_tokens, self.pad_id, self.vision_packing
        )
        dealt = deal_to_ranks(micro_batches, self.info.world_size, lambda: empty_micro_batch(self.vision_packing))
        return micro_batches, dealt[self.info.rank]

    def _forward_logprobs(self, batch: MicroBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.info.device
        output = self.model(
            input_ids=batch.input_ids.to(device),
            position_ids=batch.position_ids.to(device),
            attention_mask=None if batch.attention_mask is None else batch.attention_mask.to(device),
            use_cache=False,
            **{name: value.to(device) for name, value in batch.image_inputs().items()},
        )
        logits = output.logits
        return token_logprobs_and_entropy(
            logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1).to(device), temperature
        )

    def train_step(self, samples: list[TrainSample], objective: Objective, temperature: float = 1.0) -> dict[str, Any]:
        """One optimizer step on ``samples`` (the same full batch on every rank); returns metrics."""
        started = time.perf_counter()
        # The tokens that carry loss: a multi-turn completion's environment replies are context, not trained.
        total_loss_tokens = sum(s.num_trained for s in samples)
        if total_loss_tokens == 0:
            raise ValueError("the batch has no sampled completion tokens to learn from")
        micro_batches, mine = self._micro_batches(samples)
        # FSDP averages gradients over ranks; scaling by world size turns that into the global token sum.
        scale = self.info.world_size / total_loss_tokens
        sums = torch.zeros(5, dtype=torch.float64)  # loss, entropy, mismatch_kl, dropped, input tokens
        for index, batch in enumerate(mine):
            if self.info.is_distributed:
                self.model.set_requires_gradient_sync(index == len(mine) - 1)  # type: ignore[operator]
            logprobs, entropy = self._forward_logprobs(batch, temperature)
            result = objective(batch, logprobs)
            (result.loss * scale).backward()  # type: ignore[no-untyped-call]
            mask = batch.loss_mask.reshape(-1).to(entropy.device)
            sums += torch.tensor(
                [
                    result.loss.item(),
                    entropy[mask].sum().item(),
                    result.mismatch_kl.item(),
                    result.num_dropped.item(),
                    float(batch.num_real_tokens),
                ],
                dtype=torch.float64,
            )
        grad_norm = torch.nn.utils.clip_grad_norm_(
            trainable_parameters(self.model), self.config.optimizer.max_grad_norm
        )
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        sums = all_reduce_sum(sums, self.info)
        elapsed = time.perf_counter() - started
        return {
            "step": self.step,
            "loss": sums[0].item() / total_loss_tokens,
            "entropy": sums[1].item() / total_loss_tokens,
            "mismatch_kl": sums[2].item() / total_loss_tokens,
            "dropped_fraction": sums[3].item() / total_loss_tokens,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "num_samples": len(samples),
            "num_loss_tokens": total_loss_tokens,
            "num_micro_batches": len(micro_batches),
            "tokens_per_s": sums[4].item() / elapsed,
            "step_time_s": elapsed,
            "world_size": self.info.world_size,
        }

    def rl_step(self, samples: list[TrainSample], loss: LossConfig, temperature: float = 1.0) -> dict[str, Any]:
        """One GRPO-family step: samples carry advantages and the engine's logprobs."""
        metrics = self.train_step(samples, grpo_objective(loss), temperature)
        metrics["reward_mean"] = sum(s.reward for s in samples) / len(samples)
        return metrics

    def sft_step(self, samples: list[TrainSample]) -> dict[str, Any]:
        """One SFT step: negative log-likelihood of the completion tokens."""
        return self.train_step(samples, sft_objective)

    @torch.no_grad()
    def completion_loss(self, samples: list[TrainSample]) -> float:
        """Mean teacher-forced NLL of the trained completion tokens of ``samples`` (no update)."""
        _, mine = self._micro_batches(samples)
        total = torch.zeros(1, dtype=torch.float64)
        for batch in mine:
            logprobs, _ = self._forward_logprobs(batch, 1.0)
            total += sft_objective(batch, logprobs).loss.item()
        total = all_reduce_sum(total, self.info)
        return total.item() / max(1, sum(s.num_trained for s in samples))

    def save(self, directory: Path) -> Path:
        state = TrainerState(step=self.step, scheduler=self.scheduler.state_dict())
        return save_checkpoint(directory, self.model, self.optimizer, state, self.info)

    def resume(self, directory: Path) -> bool:
        """Load the latest trainer checkpoint under ``directory``; False when there is none."""
        target = latest_checkpoint(directory)
        if target is None:
            return False
        state = load_checkpoint(target, self.model, self.optimizer, self.info)
        self.scheduler.load_state_dict(state.scheduler)
        self.step = state.step
        log.info("resumed from %s (step %d)", target, self.step)
        return True

    @property
    def lora_enabled(self) -> bool:
        return self.config.lora.enabled

    def export(self, directory: Path) -> Path:
        """Write the current policy: an HF checkpoint directory (safetensors, config, tokenizer, a vision-language
        policy's image processor), or for a LoRA run its adapter (PEFT's layout), which engines load on top of the
        base."""
        dtype = self.config.checkpoint.export_dtype
        if self.lora_enabled:
            return export_adapter(directory, self.model, self.info, dtype)
        return export_policy(directory, self.model, self.tokenizer, self.info, dtype, self.vision)

    def export_merged(self, directory: Path) -> Path:
        """Write the current policy as an HF checkpoint directory, a LoRA run's adapters folded into the weights."""
        dtype = self.config.checkpoint.export_dtype
        return export_policy(directory, self.model, self.tokenizer, self.info, dtype, self.vision)
