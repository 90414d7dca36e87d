"""GRPO-family and SFT losses and group advantages on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.advantages import batch_advantages, group_advantages
from trainer.config import LossConfig
from trainer.loss import grpo_loss, k3_kl, sft_loss, token_logprobs_and_entropy


def _lp(*probs: float) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float64)


def test_group_advantages_are_mean_centred() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []


def test_group_advantages_std_normalised() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=True) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert group_advantages([2.0, 2.0], normalize_std=True) == [0.0, 0.0]
    # population std of [0, 3] is 1.5: advantages -1.5/1.5, 1.5/1.5
    assert group_advantages([0.0, 3.0], normalize_std=True) == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_batch_advantages_work_per_group() -> None:
    assert batch_advantages([1.0, 0.0, 0.2, 0.4], group_size=2) == pytest.approx([0.5, -0.5, -0.1, 0.1])
    with pytest.raises(ValueError, match="groups of 3"):
        batch_advantages([1.0, 0.0], group_size=3)


def test_mask_mode_drops_far_off_tokens() -> None:
    logprobs = _lp(0.5, 0.9, 0.3).requires_grad_()
    inference = _lp(0.5, 0.5, 0.3)  # ratios 1.0, 1.8, 1.0: the second is outside [0.8, 1.2]
    advantages = torch.tensor([2.0, 1.0, -0.5], dtype=torch.float64)
    mask = torch.tensor([True, True, True])
    sums = grpo_loss(logprobs, inference, advantages, mask, LossConfig(correction="mask"))
    assert sums.loss.item() == pytest.approx(-2.0 + 0.0 + 0.5)
    assert sums.num_dropped.item() == 1
    assert sums.num_tokens.item() == 3
    sums.loss.backward()  # type: ignore[no-untyped-call]
    assert logprobs.grad is not None
    # d(-r A)/d logp = -r A on kept tokens, 0 on the dropped one.
    assert logprobs.grad.tolist() == pytest.approx([-2.0, 0.0, 0.5])


def test_mask_bounds_are_configurable() -> None:
    logprobs, inference = _lp(0.9), _lp(0.5)
    sums = grpo_loss(
        logprobs, inference, torch.tensor([1.0]), torch.tensor([True]), LossConfig(correction="mask", mask_high=1.0)
    )
    assert sums.num_dropped.item() == 0
    assert sums.loss.item() == pytest.approx(-1.8)


def test_clip_mode_clips_two_sided_with_dual_cap() -> None:
    # ratios 1.5, 0.5, 0.5, 5.0 with advantages +1, +1, -1, -1
    logprobs = _lp(0.6, 0.2, 0.2, 0.5).requires_grad_()
    inference = _lp(0.4, 0.4, 0.4, 0.1)
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    config = LossConfig(correction="clip", clip_low=0.2, clip_high=0.28, clip_ratio_max=4.0)
    sums = grpo_loss(logprobs, inference, advantages, torch.ones(4, dtype=torch.bool), config)
    # min(1.5, 1.28) = 1.28 | min(0.5, 0.8) = 0.5 | min(-0.5, -0.8) = -0.8 | max(min(-5, -1.28), -4) = -4
    assert sums.loss.item() == pytest.approx(-1.28 - 0.5 + 0.8 + 4.0)
    assert sums.num_dropped.item() == 3
    sums.loss.backward()  # type: ignore[no-untyped-call]
    assert logprobs.grad is not None
    assert logprobs.grad.tolist() == pytest.approx([0.0, -0.5, 0.0, 0.0])


def test_non_completion_tokens_do_not_count() -> None:
    logprobs = _lp(0.5, 0.5).requires_grad_()
    sums = grpo_loss(logprobs, _lp(0.5, 0.01), torch.tensor([1.0, 100.0]), torch.tensor([True, False]), LossConfig())
    assert sums.loss.item() == pytest.approx(-1.0)
    assert sums.num_tokens.item() == 1
    assert sums.num_dropped.item() == 0
    assert sums.mismatch_kl.item() == pytest.approx(0.0)


def test_mismatch_kl_and_kl_penalty() -> None:
    # trainer twice as likely as the sampler: k3(log 2) = (2 - 1) - log 2
    logprobs, inference = _lp(0.4), _lp(0.2)
    config = LossConfig(correction="mask", mask_high=2.0, kl_coef=0.1)
    sums = grpo_loss(logprobs, inference, torch.tensor([0.0]), torch.tensor([True]), config)
    assert sums.mismatch_kl.item() == pytest.approx(1 - math.log(2))
    # penalty k3 of the reverse direction: (0.5 - 1) + log 2, times 0.1; the advantage term is 0
    assert sums.loss.item() == pytest.approx(0.1 * (-0.5 + math.log(2)))
    assert k3_kl(torch.tensor(0.0)).item() == 0.0


def test_token_logprobs_respect_temperature_and_entropy() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    logprobs, entropy = token_logprobs_and_entropy(logits, torch.tensor([0, 1]), temperature=2.0)
    p = math.exp(1.0) / (math.exp(1.0) + 1.0)
    assert logprobs.tolist() == pytest.approx([math.log(p), math.log(0.5)])
    assert entropy.tolist() == pytest.approx([-(p * math.log(p) + (1 - p) * math.log(1 - p)), math.log(2)])


def test_sft_loss_counts_masked_tokens_only() -> None:
    logprobs = _lp(0.5, 0.25, 0.1)
    assert sft_loss(logprobs, torch.tensor([False, True, True])).item() == pytest.approx(
        -math.log(0.25) - math.log(0.1)
    )
