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
:meth:`Trainer.sft_step`. An RL step may take its behaviour log-probabilities from the trainer itself
(:mod:`trainer.behaviour`) and is checked by the pre-step breakers (:mod:`trainer.breakers`) before
``optimizer.step()``: a tripped step leaves model, optimizer, schedule and step count as they were. A step may
also be skipped (:meth:`Trainer.skip_step`) or restore an earlier policy's weights (:meth:`Trainer.restore_step`,
a rollback); either counts as a step, so step n always publishes policy version n.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.behaviour import BehaviourPolicies
from trainer.breakers import StepFigures, breaker_trips
from trainer.checkpoint import (
    TrainerState,
    export_adapter,
    export_policy,
    latest_checkpoint,
    load_checkpoint,
    load_policy_weights,
    save_checkpoint,
    set_trainable_state,
    trainable_model_state,
)
from trainer.config import BreakerConfig, LossConfig, TrainerSection
from trainer.draws import count_off_draw, draw_gaps
from trainer.fsdp import DistInfo, all_reduce_max, all_reduce_sum, init_distributed, reshard, shard_model
from trainer.lora import apply_lora, trainable_parameters
from trainer.loss import LossSums, grpo_loss, sft_loss, token_logprobs_and_entropy
from trainer.model import load_model, load_tokenizer, load_vision_inputs
from trainer.optim import Schedule, build_optimizer, build_scheduler
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


def behaviour_of(batch: MicroBatch, logprobs: torch.Tensor) -> torch.Tensor:
    """Each target's behaviour log-probability: the recomputed ones a micro-batch carries (NaN where the policy
    being trained sampled it: the training forward's own, detached), else the sampling engine's."""
    device = logprobs.device
    if batch.behaviour_logprobs is None:
        return batch.inference_logprobs.reshape(-1).to(device)
    stored = batch.behaviour_logprobs.reshape(-1).to(device)
    return torch.where(torch.isnan(stored), logprobs.detach(), stored)


def grpo_objective(config: LossConfig, band: tuple[float, float] | None = None) -> Objective:
    def objective(batch: MicroBatch, logprobs: torch.Tensor) -> LossSums:
        device = logprobs.device
        return grpo_loss(
            logprobs,
            behaviour_of(batch, logprobs),
            batch.advantages.reshape(-1).to(device),
            batch.loss_mask.reshape(-1).to(device),
            config,
            band,
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
        self.behaviour: BehaviourPolicies | None = None
        """The policies kept to recompute behaviour log-probabilities (:meth:`keep_behaviour`); None: not kept."""
        self.grad_norms: list[float] = []
        """Pre-clip gradient norms of the applied RL steps, oldest first (the breakers' running median)."""
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

    def keep_behaviour(self, num_versions: int) -> None:
        """Keep the trained parameters of the newest ``num_versions`` policy versions from now on (call it before
        :meth:`resume`, which restores them), so RL steps can recompute behaviour log-probabilities."""
        self.behaviour = BehaviourPolicies(trainable_parameters(self.model), num_versions)
        self.behaviour.remember(self.step)

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
        logprobs, entropy, _ = self._forward(batch, temperature)
        return logprobs, entropy

    def _forward(self, batch: MicroBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The targets' log-probabilities (with grad) and the entropy at ``temperature``, and the logits (N, vocab)."""
        device = self.info.device
        output = self.model(
            input_ids=batch.input_ids.to(device),
            position_ids=batch.position_ids.to(device),
            attention_mask=None if batch.attention_mask is None else batch.attention_mask.to(device),
            use_cache=False,
            **{name: value.to(device) for name, value in batch.image_inputs().items()},
        )
        logits = output.logits.reshape(-1, output.logits.shape[-1])
        logprobs, entropy = token_logprobs_and_entropy(logits, batch.targets.reshape(-1).to(device), temperature)
        return logprobs, entropy, logits

    def _recompute_behaviour(
        self, samples: list[TrainSample], mine: list[MicroBatch], temperature: float, draws: DrawCheck | None
    ) -> float:
        """Fill each of this rank's micro-batches' behaviour log-probabilities: one no-grad forward of all of them
        per older policy version the batch holds, with that version's weights (NaN where the version being trained
        sampled the token), replaying those versions' draws into ``draws``; returns the seconds it took. Every rank
        sees the same versions, so all run the same forwards."""
        assert self.behaviour is not None
        started = time.perf_counter()
        for batch in mine:
            batch.behaviour_logprobs = torch.full(batch.inference_logprobs.shape, float("nan"))
        older = sorted({v for s in samples if (v := s.policy_version) is not None and v != self.step})
        for version in older:
            reshard(self.model)  # no unsharded copy of the other version's parameters survives the swap
            with torch.no_grad(), self.behaviour.swapped(version):
                for batch in mine:
                    logprobs, _, logits = self._forward(batch, temperature)
                    assert batch.policy_versions is not None and batch.behaviour_logprobs is not None
                    chosen = batch.policy_versions.reshape(-1) == version
                    batch.behaviour_logprobs.reshape(-1)[chosen] = logprobs.float().cpu()[chosen]
                    if draws is not None:
                        draws.replay(batch, logits, temperature, chosen & batch.loss_mask.reshape(-1))
                reshard(self.model)
        return time.perf_counter() - started

    def _trusted_samples(self, samples: list[TrainSample]) -> tuple[list[TrainSample], int]:
        """The samples whose behaviour log-probabilities the trainer can recompute (their version kept), and how
        many were left out (an older version than it keeps: their tokens are not trained)."""
        assert self.behaviour is not None
        kept = [s for s in samples if s.policy_version is None or s.policy_version in self.behaviour]
        if len(kept) < len(samples):
            log.warning(
                "step %d: %d samples of policy versions the trainer no longer keeps (it keeps %s) are not trained",
                self.step + 1,
                len(samples) - len(kept),
                self.behaviour.versions,
            )
        return kept, len(samples) - len(kept)

    def train_step(
        self,
        samples: list[TrainSample],
        objective: Objective,
        temperature: float = 1.0,
        breakers: BreakerConfig | None = None,
        recompute: bool = False,
    ) -> dict[str, Any]:
        """One optimizer step on ``samples`` (the same full batch on every rank); returns metrics. ``recompute``: the
        behaviour log-probabilities are the trainer's own (:meth:`keep_behaviour`); ``breakers``: a step that trips
        one is not applied, and its metrics say why under ``tripped``."""
        started = time.perf_counter()
        # The tokens that carry loss: a multi-turn completion's environment replies are context, not trained.
        total_loss_tokens = sum(s.num_trained for s in samples)
        if total_loss_tokens == 0:
            raise ValueError("the batch has no sampled completion tokens to learn from")
        micro_batches, mine = self._micro_batches(samples)
        tolerance = breakers.draw_tolerance if breakers is not None and recompute else None
        draws = DrawCheck(len(samples), tolerance) if tolerance is not None else None
        recompute_s = self._recompute_behaviour(samples, mine, temperature, draws) if recompute else 0.0
        # FSDP averages gradients over ranks; scaling by world size turns that into the global token sum.
        scale = self.info.world_size / total_loss_tokens
        sums = torch.zeros(6, dtype=torch.float64)  # loss, entropy, mismatch_kl, dropped, input tokens, out of band
        claim_errors = torch.zeros(len(samples), dtype=torch.float64)
        for index, batch in enumerate(mine):
            if self.info.is_distributed:
                self.model.set_requires_gradient_sync(index == len(mine) - 1)  # type: ignore[operator]
            logprobs, entropy, logits = self._forward(batch, temperature)
            result = objective(batch, logprobs)
            (result.loss * scale).backward()  # type: ignore[no-untyped-call]
            mask = batch.loss_mask.reshape(-1).to(entropy.device)
            if recompute:
                _claim_errors(batch, behaviour_of(batch, logprobs), mask, claim_errors)
            if draws is not None and batch.policy_versions is not None:
                current = (batch.policy_versions.reshape(-1) == self.step) | (batch.policy_versions.reshape(-1) < 0)
                draws.replay(batch, logits, temperature, current & batch.loss_mask.reshape(-1))
            del logits
            out_of_band = result.num_out_of_band
            sums += torch.tensor(
                [
                    result.loss.item(),
                    entropy[mask].sum().item(),
                    result.mismatch_kl.item(),
                    result.num_dropped.item(),
                    float(batch.num_real_tokens),
                    0.0 if out_of_band is None else out_of_band.item(),
                ],
                dtype=torch.float64,
            )
        grad_norm = torch.nn.utils.clip_grad_norm_(
            trainable_parameters(self.model), self.config.optimizer.max_grad_norm
        )
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        sums = all_reduce_sum(sums, self.info)
        off_draw = all_reduce_sum(draws.counts, self.info) if draws is not None else None
        figures = StepFigures(
            grad_norm=float(grad_norm),
            loss=sums[0].item() / total_loss_tokens,
            out_of_band_fraction=sums[5].item() / total_loss_tokens,
            mismatch_kl=sums[2].item() / total_loss_tokens,
            off_draw_samples=0 if off_draw is None else int((off_draw > 0).sum()),
            recomputed=recompute,
        )
        trips = breaker_trips(figures, self.grad_norms, breakers) if breakers is not None else []
        lr = self.scheduler.get_last_lr()[0]
        self._apply(figures, trips, breakers)
        elapsed = time.perf_counter() - started
        metrics: dict[str, Any] = {
            "step": self.step if not trips else self.step + 1,
            "loss": figures.loss,
            "entropy": sums[1].item() / total_loss_tokens,
            "mismatch_kl": figures.mismatch_kl,
            "dropped_fraction": sums[3].item() / total_loss_tokens,
            "out_of_band_fraction": figures.out_of_band_fraction,
            "grad_norm": figures.grad_norm,
            "lr": lr,
            "num_samples": len(samples),
            "num_loss_tokens": total_loss_tokens,
            "num_micro_batches": len(micro_batches),
            "tokens_per_s": sums[4].item() / elapsed,
            "step_time_s": elapsed,
            "world_size": self.info.world_size,
        }
        if draws is not None and off_draw is not None:
            metrics["draw_gap_max"] = float(
                all_reduce_max(torch.tensor([draws.gap_max], dtype=torch.float64), self.info)
            )
            metrics["off_draw_samples"] = [i for i, count in enumerate(off_draw.tolist()) if count > 0]
        if recompute:
            errors = all_reduce_max(claim_errors, self.info)
            metrics["behaviour_recompute_s"] = recompute_s
            metrics["claimed_logprob_error_max"] = float(errors.max()) if len(errors) else 0.0
            metrics["claim_errors"] = errors.tolist()
        if trips:
            metrics["tripped"] = trips
        return metrics

    def _apply(self, figures: StepFigures, trips: list[str], breakers: BreakerConfig | None) -> None:
        """Step the optimizer and the schedule, count the step and keep its policy, unless a breaker tripped: then
        drop the gradient and leave everything as it was."""
        if trips:
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if breakers is not None:
            self.grad_norms = [*self.grad_norms, figures.grad_norm][-breakers.median_steps :]
        if self.behaviour is not None:
            self.behaviour.remember(self.step)

    def rl_step(
        self,
        samples: list[TrainSample],
        loss: LossConfig,
        temperature: float = 1.0,
        breakers: BreakerConfig | None = None,
    ) -> dict[str, Any]:
        """One GRPO-family step: samples carry advantages and the engine's logprobs. With
        ``loss.behaviour_logprobs = "recompute"`` (it needs :meth:`keep_behaviour`) the ratio's denominator is
        recomputed here from each sample's policy version and the engine's numbers are only compared with it
        (``claim_errors``: each sample's largest difference, in batch order); ``breakers`` guard the update."""
        recompute = loss.behaviour_logprobs == "recompute"
        if recompute and self.behaviour is None:
            raise ValueError("behaviour_logprobs = recompute needs the trainer to keep its policies (keep_behaviour)")
        untrusted = 0
        if recompute:
            samples, untrusted = self._trusted_samples(samples)
        band = breakers.ratio_band if breakers is not None else None
        metrics = self.train_step(samples, grpo_objective(loss, band), temperature, breakers, recompute)
        metrics["reward_mean"] = sum(s.reward for s in samples) / len(samples)
        metrics["untrusted_samples"] = untrusted
        if recompute:
            metrics["claim_groups"] = [s.group for s in samples]
        if "off_draw_samples" in metrics:
            metrics["off_draw_groups"] = sorted({samples[i].group for i in metrics.pop("off_draw_samples")})
        return metrics

    def skip_step(self) -> dict[str, Any]:
        """Count a step without changing the weights (one whose batch a breaker refused and re-audit could not
        explain): its policy is the previous one's."""
        self.scheduler.step()
        self.step += 1
        if self.behaviour is not None:
            self.behaviour.remember(self.step)
        return {"step": self.step, "skipped": True, "world_size": self.info.world_size}

    def restore_step(self, policy_dir: Path, lr_scale: float = 1.0) -> dict[str, Any]:
        """A rollback as a step: the weights of the exported policy at ``policy_dir`` (an earlier version's),
        Adam's moments reset (they carry the direction that was undone), the learning rate times ``lr_scale`` from
        now on and warmed up again from the next step (:class:`~trainer.optim.Schedule`: fresh moments make Adam's
        first steps move every parameter by about the learning rate, which undid a restored tiny policy in two
        steps); the step's policy is that version's."""
        started = time.perf_counter()
        load_policy_weights(self.model, policy_dir, self.config, self.info)
        self.optimizer.state.clear()
        self.scheduler.base_lrs = [lr * lr_scale for lr in self.scheduler.base_lrs]
        for schedule in self.scheduler.lr_lambdas:
            if isinstance(schedule, Schedule):
                schedule.rewarm(self.scheduler.last_epoch + 1)
        self.scheduler.step()
        self.step += 1
        if self.behaviour is not None:
            self.behaviour.remember(self.step)
        elapsed = time.perf_counter() - started
        return {"step": self.step, "restored": str(policy_dir), "lr_scale": lr_scale, "step_time_s": elapsed}

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

    def _behaviour_states(self) -> dict[int, dict[str, torch.Tensor]]:
        """The full trained state of every kept policy version but the current one (rank 0 holds the tensors)."""
        if self.behaviour is None:
            return {}
        states: dict[int, dict[str, torch.Tensor]] = {}
        for version in self.behaviour.versions:
            if version == self.step:
                continue
            reshard(self.model)
            with self.behaviour.swapped(version):
                states[version] = trainable_model_state(self.model, self.info)
        reshard(self.model)
        return states

    def save(self, directory: Path) -> Path:
        state = TrainerState(
            step=self.step,
            scheduler=self.scheduler.state_dict(),
            grad_norms=list(self.grad_norms),
            behaviour=self._behaviour_states(),
        )
        return save_checkpoint(directory, self.model, self.optimizer, state, self.info)

    def resume(self, directory: Path) -> bool:
        """Load the latest trainer checkpoint under ``directory``; False when there is none."""
        target = latest_checkpoint(directory)
        if target is None:
            return False
        state = load_checkpoint(target, self.model, self.optimizer, self.info)
        self.scheduler.load_state_dict(state.scheduler)
        self.step = state.step
        self.grad_norms = list(state.grad_norms)
        if self.behaviour is not None:
            self._restore_behaviour(state.behaviour)
        log.info("resumed from %s (step %d)", target, self.step)
        return True

    def _restore_behaviour(self, states: dict[int, dict[str, torch.Tensor]]) -> None:
        """Rebuild the kept policy versions from a checkpoint's ``states`` (every rank is given the versions; rank 0
        the tensors), then put the current version's weights back."""
        assert self.behaviour is not None
        self.behaviour.forget()
        self.behaviour.remember(self.step)
        for version in sorted(states):
            reshard(self.model)
            set_trainable_state(self.model, states[version], self.info)
            self.behaviour.remember(version)
        self.behaviour.reload_current()
        reshard(self.model)

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


class DrawCheck:
    """The replay of a step's trained tokens' draws (:mod:`trainer.draws`): per sample, its tokens over the
    tolerance, and the largest gap seen (an honest run's rounding)."""

    def __init__(self, num_samples: int, tolerance: float) -> None:
        self.tolerance = tolerance
        self.counts = torch.zeros(num_samples, dtype=torch.float64)
        self.gap_max = 0.0

    def replay(self, batch: MicroBatch, logits: torch.Tensor, temperature: float, rows: torch.Tensor) -> None:
        """Replay the draws of ``batch``'s targets where ``rows`` is true, with ``logits`` (N, vocab)."""
        if batch.draw_seeds is None or batch.draw_streams is None or batch.draw_positions is None:
            return
        rows = rows.cpu()
        seeds = torch.where(rows, batch.draw_seeds.reshape(-1), torch.full_like(batch.draw_seeds.reshape(-1), -1))
        gaps = draw_gaps(
            logits,
            temperature,
            batch.targets.reshape(-1),
            seeds,
            batch.draw_streams.reshape(-1),
            batch.draw_positions.reshape(-1),
        )
        finite = gaps[~torch.isnan(gaps)]
        if finite.numel():
            self.gap_max = max(self.gap_max, float(finite.max()))
        assert batch.sample_index is not None
        count_off_draw(gaps, batch.sample_index.reshape(-1), self.tolerance, self.counts)


def _claim_errors(batch: MicroBatch, behaviour: torch.Tensor, mask: torch.Tensor, errors: torch.Tensor) -> None:
    """Raise ``errors[i]`` (per sample of the batch) to the largest difference between sample i's claimed and
    recomputed behaviour log-probabilities among its trained tokens in ``batch``."""
    if batch.sample_index is None:
        return
    index = batch.sample_index.reshape(-1).to(mask.device)
    chosen = mask & (index >= 0)
    if not bool(chosen.any()):
        return
    claimed = batch.inference_logprobs.reshape(-1).to(behaviour.device)
    diff = (claimed - behaviour.detach()).abs().double().cpu()[chosen.cpu()]
    where = index.cpu()[chosen.cpu()]
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, float("inf")))
    errors.scatter_reduce_(0, where, diff, reduce="amax")
