"""Packing: no cross-sample attention, aligned targets and masks, balanced ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.packing import deal_to_ranks, make_micro_batches, plan_bins
from trainer.transport import TrainSample


def _samples() -> list[TrainSample]:
    return [
        TrainSample(prompt_ids=[5, 6, 7], completion_ids=[8, 9], advantage=1.0, inference_logprobs=[-0.1, -0.2]),
        TrainSample(prompt_ids=[10], completion_ids=[11, 12, 13], advantage=-0.5, inference_logprobs=[-1, -2, -3]),
        TrainSample(prompt_ids=[20, 21], completion_ids=[22], advantage=0.25, inference_logprobs=[-0.5]),
    ]


def test_plan_bins_first_fit_decreasing() -> None:
    assert plan_bins([5, 3, 4, 2], capacity=7) == [[0, 3], [2, 1]]
    with pytest.raises(ValueError, match="exceeds"):
        plan_bins([8], capacity=7)


def test_packed_row_alignment() -> None:
    (batch,) = make_micro_batches(_samples(), micro_batch_tokens=64, row_tokens=64)
    assert batch.input_ids.shape == (1, 12)
    order = batch.sample_ids
    assert sorted(order) == [0, 1, 2]
    assert batch.num_real_tokens == 12
    # Reconstruct each sample's targets and per-token data from the row.
    start = 0
    for index in order:
        sample = _samples()[index]
        length = sample.num_tokens
        tokens = sample.prompt_ids + sample.completion_ids
        assert batch.input_ids[0, start : start + length].tolist() == tokens
        assert batch.position_ids[0, start : start + length].tolist() == list(range(length))
        mask = batch.loss_mask[0, start : start + length]
        targets = batch.targets[0, start : start + length][mask].tolist()
        assert targets == sample.completion_ids
        assert batch.inference_logprobs[0, start : start + length][mask].tolist() == pytest.approx(
            sample.inference_logprobs
        )
        assert batch.advantages[0, start : start + length][mask].tolist() == [sample.advantage] * len(targets)
        start += length
    assert batch.num_loss_tokens == 6


def test_rows_respect_row_tokens_and_micro_batch_budget() -> None:
    samples = [TrainSample(prompt_ids=[1] * 3, completion_ids=[2] * (k % 5 + 1)) for k in range(40)]
    batches = make_micro_batches(samples, micro_batch_tokens=64, row_tokens=16)
    assert sorted(i for b in batches for i in b.sample_ids) == list(range(40))
    for batch in batches:
        assert batch.input_ids.numel() <= 64
        assert batch.input_ids.shape[1] <= 16
    padding = sum(b.input_ids.numel() - b.num_real_tokens for b in batches)
    assert padding < 0.1 * sum(s.num_tokens for s in samples)


def test_unpacked_baseline_pads_consecutive_samples() -> None:
    batches = make_micro_batches(_samples(), micro_batch_tokens=10, packed=False, pad_id=99)
    assert [b.sample_ids for b in batches] == [[0, 1], [2]]
    first = batches[0]
    assert first.input_ids.tolist() == [[5, 6, 7, 8, 9], [10, 11, 12, 13, 99]]
    assert first.attention_mask is not None
    assert first.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]


def test_deal_to_ranks_gives_equal_counts() -> None:
    samples = [TrainSample(prompt_ids=[1] * 10, completion_ids=[2] * k) for k in range(1, 6)]
    batches = make_micro_batches(samples, micro_batch_tokens=16, row_tokens=16)
    dealt = deal_to_ranks(batches, world_size=2)
    assert len(dealt[0]) == len(dealt[1]) == 3
    real = [b for rank in dealt for b in rank if b.num_samples]
    assert len(real) == len(batches) == 5
    fillers = [b for rank in dealt for b in rank if not b.num_samples]
    assert len(fillers) == 1 and fillers[0].num_loss_tokens == 0


def test_packed_logits_equal_separate_forward(tiny_model_dir: Path) -> None:
    from trainer.model import load_model

    model: Any = load_model(str(tiny_model_dir))
    model.eval()
    samples = _samples()
    for packed in (True, False):
        (batch,) = make_micro_batches(samples, micro_batch_tokens=64, packed=packed, row_tokens=64)
        with torch.no_grad():
            logits = model(
                input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=batch.attention_mask
            ).logits
        start = 0
        for row, index in enumerate(batch.sample_ids):
            tokens = samples[index].prompt_ids + samples[index].completion_ids
            with torch.no_grad():
                alone = model(input_ids=torch.tensor([tokens])).logits[0]
            if packed:
                got = logits[0, start : start + len(tokens)]
                start += len(tokens)
            else:
                got = logits[row, : len(tokens)]
            torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)


def test_a_sample_longer_than_row_tokens_gets_a_wider_row() -> None:
    samples = [TrainSample(prompt_ids=[1] * 30, completion_ids=[2] * 10), TrainSample([3], [4])]
    batches = make_micro_batches(samples, micro_batch_tokens=128, row_tokens=16)
    assert sorted(i for b in batches for i in b.sample_ids) == [0, 1]
    with pytest.raises(ValueError, match="exceeds"):
        make_micro_batches(samples, micro_batch_tokens=32, row_tokens=16)


def test_only_sampled_completion_tokens_carry_loss() -> None:
    """A multi-turn sample: an environment reply (tokens 30, 31) between two sampled turns gets no loss."""
    episode = TrainSample(
        prompt_ids=[5, 6],
        completion_ids=[7, 8, 30, 31, 9],
        advantage=2.0,
        inference_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3],
        sampled=[True, True, False, False, True],
    )
    for packed in (True, False):
        (batch,) = make_micro_batches([episode], micro_batch_tokens=64, packed=packed)
        mask = batch.loss_mask[0]
        assert batch.targets[0][mask].tolist() == [7, 8, 9]
        assert batch.inference_logprobs[0][mask].tolist() == pytest.approx([-0.1, -0.2, -0.3])
        assert batch.advantages[0][mask].tolist() == [2.0] * 3
        assert batch.num_loss_tokens == 3
    with pytest.raises(ValueError, match="2 sampled flags for 5 completion tokens"):
        make_micro_batches([TrainSample([1], [2, 3, 4, 5, 6], sampled=[True, False])], micro_batch_tokens=64)
