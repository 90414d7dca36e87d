"""Packing variable-length samples into micro-batches, and dealing them to ranks.

A :class:`~trainer.transport.TrainSample` is prompt + completion token ids with per-completion-token data
(advantage, the engine's logprobs). Packing concatenates whole samples into rows of at most
``row_tokens`` tokens (first-fit-decreasing), with position ids restarting at 0 at each
sample and a block-diagonal causal mask, so a token attends within its own sample only; rows
of similar fill share a micro-batch, so the only padding is the little left at row ends.
Rows, rather than one long row per micro-batch, because SDPA with a dense mask costs
O(row length^2) on CPU whatever the mask hides; on GPUs set ``row_tokens`` to
``micro_batch_tokens``. The unpacked baseline pads each sample of a micro-batch to the longest.

Every per-token tensor of a micro-batch is aligned with the *input* positions: position j
holds the target token j + 1 of the same sample, and ``loss_mask[j]`` is true where that
target is a completion token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.transport import TrainSample


@dataclass
class MicroBatch:
    """Tensors of shape (rows, length); rows = 1 when packed."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    inference_logprobs: torch.Tensor
    attention_mask: torch.Tensor | None = None
    """Packed: (rows, 1, length, length) block-diagonal causal bool mask; padded: (rows, length) 0/1."""
    num_samples: int = 0
    sample_ids: list[int] = field(default_factory=list)
    num_real_tokens: int = 0
    """Tokens that belong to a sample (the rest is padding)."""

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def _sample_rows(sample: TrainSample) -> dict[str, list[Any]]:
    tokens = sample.prompt_ids + sample.completion_ids
    length, first = len(tokens), len(sample.prompt_ids) - 1
    logprobs = sample.inference_logprobs or [0.0] * len(sample.completion_ids)
    if len(logprobs) != len(sample.completion_ids):
        raise ValueError(f"{len(logprobs)} inference logprobs for {len(sample.completion_ids)} completion tokens")
    if not sample.prompt_ids:
        raise ValueError("a sample needs at least one prompt token")
    sampled = sample.sampled if sample.sampled is not None else [True] * len(sample.completion_ids)
    if len(sampled) != len(sample.completion_ids):
        raise ValueError(f"{len(sampled)} sampled flags for {len(sample.completion_ids)} completion tokens")
    # position j predicts token j + 1: it carries loss when that token is a sampled completion token
    in_completion = [first <= j < length - 1 and sampled[j - first] for j in range(length)]
    return {
        "input_ids": tokens,
        "position_ids": list(range(length)),
        "targets": [*tokens[1:], 0],
        "loss_mask": in_completion,
        "advantages": [sample.advantage if m else 0.0 for m in in_completion],
        "inference_logprobs": [logprobs[j - first] if m else 0.0 for j, m in enumerate(in_completion)],
    }


_DTYPES = {
    "input_ids": torch.long,
    "position_ids": torch.long,
    "targets": torch.long,
    "loss_mask": torch.bool,
    "advantages": torch.float32,
    "inference_logprobs": torch.float32,
}


def _tensors(rows: list[list[dict[str, list[Any]]]], width: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Rows of concatenated samples, each padded at its end to ``width``."""
    tensors: dict[str, torch.Tensor] = {}
    for key, dtype in _DTYPES.items():
        fill = pad_id if key == "input_ids" else 0
        table = []
        for row in rows:
            values = [v for sample in row for v in sample[key]]
            table.append(values + [fill] * (width - len(values)))
        tensors[key] = torch.tensor(table, dtype=dtype)
    return tensors


def _block_causal_mask(rows: list[list[dict[str, list[Any]]]], width: int) -> torch.Tensor:
    """(rows, 1, width, width) bool: a token attends to earlier tokens of its own sample only.

    The padding at a row's end forms its own block, so no query row is fully masked.
    """
    segment = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for index, sample in enumerate(row):
            length = len(sample["input_ids"])
            segment[r, start : start + length] = index
            start += length
        segment[r, start:] = len(row)
    same = segment.unsqueeze(2) == segment.unsqueeze(1)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    return (same & causal).unsqueeze(1)


def _packed(samples: list[TrainSample], rows: list[list[int]], pad_id: int) -> MicroBatch:
    sample_rows = [[_sample_rows(samples[i]) for i in row] for row in rows]
    width = max(sum(samples[i].num_tokens for i in row) for row in rows)
    tensors = _tensors(sample_rows, width, pad_id)
    # Position ids restart at 0 for each sample; the end-of-row padding counts from 0 as well.
    for r, row in enumerate(rows):
        used = sum(samples[i].num_tokens for i in row)
        tensors["position_ids"][r, used:] = torch.arange(width - used)
    ids = [i for row in rows for i in row]
    real = sum(samples[i].num_tokens for i in ids)
    mask = _block_causal_mask(sample_rows, width)
    return MicroBatch(**tensors, attention_mask=mask, num_samples=len(ids), sample_ids=ids, num_real_tokens=real)


def _padded(samples: list[TrainSample], ids: list[int], pad_id: int) -> MicroBatch:
    rows = [[_sample_rows(samples[i])] for i in ids]
    width = max(samples[i].num_tokens for i in ids)
    tensors = _tensors(rows, width, pad_id)
    attention = torch.tensor([[1] * samples[i].num_tokens + [0] * (width - samples[i].num_tokens) for i in ids])
    real = sum(samples[i].num_tokens for i in ids)
    return MicroBatch(**tensors, attention_mask=attention, num_samples=len(ids), sample_ids=ids, num_real_tokens=real)


def plan_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit-decreasing: groups of indices whose lengths sum to at most ``capacity``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        if lengths[i] > capacity:
            raise ValueError(f"a sample of {lengths[i]} tokens exceeds the packing capacity of {capacity} tokens")
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def _chunk_rows(widths: list[int], micro_batch_tokens: int) -> list[list[int]]:
    """Consecutive groups of rows whose (count x widest) stays within ``micro_batch_tokens``."""
    groups: list[list[int]] = []
    widest = 0
    for i, width in enumerate(widths):
        if groups and (len(groups[-1]) + 1) * max(widest, width) <= micro_batch_tokens:
            groups[-1].append(i)
            widest = max(widest, width)
        else:
            groups.append([i])
            widest = width
    return groups


def make_micro_batches(
    samples: list[TrainSample],
    micro_batch_tokens: int,
    packed: bool = True,
    row_tokens: int | None = None,
    pad_id: int = 0,
) -> list[MicroBatch]:
    """Micro-batches of at most ``micro_batch_tokens`` tokens (padding included) each.

    Packed: samples go into rows of at most ``row_tokens`` tokens (or the longest sample, if
    longer) by first-fit-decreasing, rows into micro-batches. Unpacked (the baseline):
    consecutive samples, one per row, each padded to the longest of its micro-batch.
    """
    if not samples:
        return []
    if packed:
        longest = max(s.num_tokens for s in samples)
        # A row is at least as wide as the longest sample, so every sample fits one.
        row_capacity = min(max(row_tokens or micro_batch_tokens, longest), micro_batch_tokens)
        rows = plan_bins([s.num_tokens for s in samples], row_capacity)
        rows.sort(key=lambda row: -sum(samples[i].num_tokens for i in row))
        widths = [sum(samples[i].num_tokens for i in row) for row in rows]
        return [_packed(samples, [rows[r] for r in group], pad_id) for group in _chunk_rows(widths, micro_batch_tokens)]
    lengths = [s.num_tokens for s in samples]
    if max(lengths) > micro_batch_tokens:
        raise ValueError(f"a sample of {max(lengths)} tokens exceeds micro_batch_tokens={micro_batch_tokens}")
    groups = _chunk_rows(lengths, micro_batch_tokens)
    return [_padded(samples, group, pad_id) for group in groups]


def empty_micro_batch() -> MicroBatch:
    """One token with nothing to learn: keeps a rank's collective calls in step with the others."""
    zeros = torch.zeros((1, 1), dtype=torch.long)
    return MicroBatch(
        input_ids=zeros,
        position_ids=zeros.clone(),
        targets=zeros.clone(),
        loss_mask=torch.zeros((1, 1), dtype=torch.bool),
        advantages=torch.zeros((1, 1)),
        inference_logprobs=torch.zeros((1, 1)),
    )


def deal_to_ranks(micro_batches: list[MicroBatch], world_size: int) -> list[list[MicroBatch]]:
    """Deal micro-batches to ranks, heaviest first to the lightest rank; every rank gets the same count.

    Ranks that run short get :func:`empty_micro_batch` fillers, since FSDP's collectives
    need every rank to run the same number of forward/backward passes.
    """
    order = sorted(range(len(micro_batches)), key=lambda i: (-micro_batches[i].input_ids.numel(), i))
    per_rank: list[list[MicroBatch]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    count = -(-len(micro_batches) // world_size) if micro_batches else 1
    for i in order:
        rank = min((r for r in range(world_size) if len(per_rank[r]) < count), key=lambda r: (load[r], r))
        per_rank[rank].append(micro_batches[i])
        load[rank] += micro_batches[i].input_ids.numel()
    for batches in per_rank:
        batches.extend(empty_micro_batch() for _ in range(count - len(batches)))
    return per_rank
