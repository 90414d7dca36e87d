"""Token-level losses: GRPO family with bounded off-policy correction, and SFT cross-entropy.

Pure tensor functions over flat per-token tensors (one entry per predicted position). Each
returns *sums* over the tokens it is given, never means: the caller divides by the number of
loss tokens of the whole step (all micro-batches, all ranks), so a token weighs the same
whichever micro-batch or rank it landed on ("loss normalised by tokens").

Notation: ``logprobs`` are the trainer's log pi(token) at the sampling temperature (with
grad); ``behaviour_logprobs`` are the token's log-probabilities under the policy that sampled it
(recomputed by the trainer, or the sampling engine's where a validator checked them, see
:mod:`trainer.behaviour`); the importance ratio is ``r = exp(logprobs - behaviour_logprobs)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import LossConfig


@dataclass
class LossSums:
    """Per-step sums; divide by ``num_tokens`` (all-reduced) for means."""

    loss: torch.Tensor
    """Differentiable sum of per-token losses."""
    num_tokens: torch.Tensor
    num_dropped: torch.Tensor
    """Tokens the correction dropped (mask) or clipped (clip)."""
    mismatch_kl: torch.Tensor
    """Sum of the k3 estimate of KL(behaviour || trainer) per token."""
    num_out_of_band: torch.Tensor | None = None
    """Tokens whose ratio is outside the breakers' band (None: not counted)."""


def token_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T)[target] (with grad) and the entropy of softmax(logits / T) (no grad).

    ``logits`` (N, V), ``targets`` (N,). Computed in float32 whatever the model's dtype.
    """
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


def k3_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate ``(r - 1) - log r`` of KL(sampler || policy), with r = exp(log_ratio) (>= 0)."""
    return torch.expm1(log_ratio) - log_ratio


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    band: tuple[float, float] | None = None,
) -> LossSums:
    """Sum of GRPO-family token losses; ``mask`` (bool) marks completion tokens; ``band``: count the tokens whose
    ratio falls outside it.

    mask mode:  -r * A on tokens with r in [1 - mask_low, 1 + mask_high], 0 elsewhere.
    clip mode:  -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A), and for A < 0 at most
                -clip_ratio_max * A (dual clip).
    Optional:   + kl_coef * k3(-log r), the k3 estimate of KL(policy || sampler), on every completion token.
    """
    mask = mask.bool()
    log_ratio = logprobs - behaviour_logprobs
    ratio = torch.exp(log_ratio)
    if config.correction == "mask":
        kept = (ratio >= 1 - config.mask_low) & (ratio <= 1 + config.mask_high)
        token_loss = -ratio * advantages * kept.detach()
        dropped = ~kept
    else:
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high) * advantages
        surrogate = torch.minimum(unclipped, clipped)
        capped = torch.where(advantages < 0, torch.maximum(surrogate, config.clip_ratio_max * advantages), surrogate)
        token_loss = -capped
        dropped = (capped != unclipped).detach()
    if config.kl_coef > 0:
        token_loss = token_loss + config.kl_coef * k3_kl(-log_ratio)
    zero = torch.zeros((), dtype=token_loss.dtype, device=token_loss.device)
    with torch.no_grad():
        mismatch = torch.where(mask, k3_kl(log_ratio.detach()), zero).sum()
        num_dropped = (dropped & mask).sum()
        out_of_band = None
        if band is not None:
            outside = (ratio < band[0]) | (ratio > band[1]) | ~torch.isfinite(ratio)
            out_of_band = (outside & mask).sum()
    return LossSums(
        loss=torch.where(mask, token_loss, zero).sum(),
        num_tokens=mask.sum(),
        num_dropped=num_dropped,
        mismatch_kl=mismatch,
        num_out_of_band=out_of_band,
    )


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the negative log-likelihood of the masked (completion) tokens."""
    return -(logprobs * mask.to(logprobs.dtype)).sum()
