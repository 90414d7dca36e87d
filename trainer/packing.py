"""Packing variable-length samples into micro-batches, and dealing them to ranks.

A :class:`TrainSample` is prompt + completion token ids with per-completion-token data
(advantage, the engine's logprobs). Packing concatenates whole samples into one row of at
most ``micro_batch_tokens`` tokens, first-fit-decreasing, with position ids restarting at 0 at
each sample; SDPA then attends within each sample only (a block-diagonal causal mask), so
no token is padding. The unpacked baseline pads each sample of a micro-batch to the longest.

Every per-token tensor of a micro-batch is aligned with the *input* positions: position j
holds the target token j + 1 of the same sample, and ``loss_mask[j]`` is true where that
target is a completion token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float = 0.0
    """The sample's (group-relative) advantage; unused by SFT."""
    inference_logprobs: list[float] | None = None
    """One per completion token, from the engine that sampled it; None for SFT."""
    reward: float = 0.0
    """For metrics only."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


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
    """Only for the padded baseline; packed rows need none."""
    num_samples: int = 0
    sample_ids: list[int] = field(default_factory=list)

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    @property
    def num_input_tokens(self) -> int:
        """Real (non-padding) tokens."""
        if self.attention_mask is None:
            return int(self.input_ids.numel())
        return int(self.attention_mask.sum().item())


def _sample_rows(sample: TrainSample) -> dict[str, list[float] | list[int] | list[bool]]:
    tokens = sample.prompt_ids + sample.completion_ids
    length, first = len(tokens), len(sample.prompt_ids) - 1
    logprobs = sample.inference_logprobs or [0.0] * len(sample.completion_ids)
    if len(logprobs) != len(sample.completion_ids):
        raise ValueError(f"{len(logprobs)} inference logprobs for {len(sample.completion_ids)} completion tokens")
    if not sample.prompt_ids:
        raise ValueError("a sample needs at least one prompt token")
    in_completion = [first <= j < length - 1 for j in range(length)]
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


def _concat(samples: list[TrainSample], ids: list[int]) -> MicroBatch:
    columns: dict[str, list[float] | list[int] | list[bool]] = {key: [] for key in _DTYPES}
    for sample in samples:
        for key, values in _sample_rows(sample).items():
            columns[key].extend(values)  # type: ignore[arg-type]
    tensors = {key: torch.tensor([values], dtype=_DTYPES[key]) for key, values in columns.items()}
    return MicroBatch(**tensors, num_samples=len(samples), sample_ids=ids)


def _padded(samples: list[TrainSample], ids: list[int], pad_id: int) -> MicroBatch:
    rows = [_sample_rows(s) for s in samples]
    width = max(len(r["input_ids"]) for r in rows)
    tensors: dict[str, torch.Tensor] = {}
    for key, dtype in _DTYPES.items():
        fill: float | int | bool = pad_id if key == "input_ids" else False if key == "loss_mask" else 0
        padded = [list(r[key]) + [fill] * (width - len(r[key])) for r in rows]
        tensors[key] = torch.tensor(padded, dtype=dtype)
    attention = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows])
    return MicroBatch(**tensors, attention_mask=attention, num_samples=len(samples), sample_ids=ids)


def plan_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit-decreasing: groups of indices whose lengths sum to at most ``capacity``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        if lengths[i] > capacity:
            raise ValueError(f"a sample of {lengths[i]} tokens exceeds micro_batch_tokens={capacity}")
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def make_micro_batches(
    samples: list[TrainSample], micro_batch_tokens: int, packed: bool = True, pad_id: int = 0
) -> list[MicroBatch]:
    """Micro-batches of at most ``micro_batch_tokens`` real tokens each, packed or padded."""
    bins = plan_bins([s.num_tokens for s in samples], micro_batch_tokens)
    if packed:
        return [_concat([samples[i] for i in b], b) for b in bins]
    return [_padded([samples[i] for i in b], b, pad_id) for b in bins]


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
    order = sorted(range(len(micro_batches)), key=lambda i: (-micro_batches[i].num_input_tokens, i))
    per_rank: list[list[MicroBatch]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    count = -(-len(micro_batches) // world_size) if micro_batches else 1
    for i in order:
        rank = min((r for r in range(world_size) if len(per_rank[r]) < count), key=lambda r: (load[r], r))
        per_rank[rank].append(micro_batches[i])
        load[rank] += micro_batches[i].num_input_tokens
    for batches in per_rank:
        batches.extend(empty_micro_batch() for _ in range(count - len(batches)))
    return per_rank
