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

A vision-language policy (:class:`VisionPacking`) adds each sample's images: their pixel patches, concatenated
in the order their image tokens appear in the micro-batch's rows read one after another (the order in which
the model puts image features in place of image tokens), and multimodal rotary positions of shape
(3, rows, length) in (time, height, width), each sample's computed for it alone by the model's own rule and
placed as its text positions are. Every micro-batch of such a run shows the vision tower an image: one
without any gets a loss-free row holding a one-pixel image, so that sharded ranks run the tower's layers
(their collectives) alike whatever their share holds, and a trainable tower gets a gradient on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from engines.vision import PixelInputs, VisionInputs
from environments.images import Image
from trainer.transport import TrainSample

IDLE_IMAGE = Image(1, 1, bytes(3))
"""The image of a micro-batch that shows none (one black pixel; the processor enlarges it to its smallest size)."""


class SamplePositions(Protocol):
    """A vision-language model's rotary positions for one sample (Qwen2-VL: its ``get_rope_index``)."""

    def __call__(
        self, input_ids: torch.Tensor, image_token_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
    ) -> torch.Tensor:
        """(3, length): the positions of the sample's tokens ``input_ids`` (length,), counted from 0, whose image
        tokens (``image_token_mask``, 1 where one is) stand for images of patch grids ``image_grid_thw``."""
        ...


@dataclass(frozen=True)
class VisionPacking:
    """What packing needs of a vision-language policy: its image inputs, and its rule for a sample's positions."""

    inputs: VisionInputs
    positions: SamplePositions


@dataclass(frozen=True)
class _SampleImages:
    """One sample's images as the model takes them, and its multimodal positions."""

    positions: torch.Tensor
    """(3, num_tokens)."""
    pixels: PixelInputs | None
    """None: the sample shows no image."""


@dataclass
class MicroBatch:
    """Tensors of shape (rows, length)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    """(rows, length); a vision-language policy's: (3, rows, length), in (time, height, width)."""
    targets: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    inference_logprobs: torch.Tensor
    """The sampling engine's log-probability of each target, as the batch carries it."""
    policy_versions: torch.Tensor | None = None
    """(rows, length) long: the version that sampled each target's sample (-1: the policy being trained)."""
    sample_index: torch.Tensor | None = None
    """(rows, length) long: which of the batch's samples each position belongs to (-1: padding)."""
    draw_seeds: torch.Tensor | None = None
    """(rows, length) long: the seed each trained target was drawn with (-1: not replayed)."""
    draw_streams: torch.Tensor | None = None
    draw_positions: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    """Set by a trainer that recomputes them: each target's log-probability under the version that sampled it (NaN:
    the version being trained, whose training forward gives it); None: the engine's numbers are used."""
    attention_mask: torch.Tensor | None = None
    """Packed: (rows, 1, length, length) block-diagonal causal bool mask; padded: (rows, length) 0/1."""
    num_samples: int = 0
    sample_ids: list[int] = field(default_factory=list)
    num_real_tokens: int = 0
    """Tokens that belong to a sample (the rest is padding)."""
    pixel_values: torch.Tensor | None = None
    """A vision-language policy's: the patches of every image shown, in the order of their image tokens."""
    image_grid_thw: torch.Tensor | None = None
    """(images, 3): each image's patch grid."""
    mm_token_type_ids: torch.Tensor | None = None
    """(rows, length): 1 at image tokens, else 0."""

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def image_inputs(self) -> dict[str, torch.Tensor]:
        """The model's image arguments (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``); empty for a
        text-only policy."""
        inputs = {
            "pixel_values": self.pixel_values,
            "image_grid_thw": self.image_grid_thw,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        return {name: value for name, value in inputs.items() if value is not None}


def _sample_rows(sample: TrainSample, index: int = -1) -> dict[str, list[Any]]:
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
        "policy_versions": [-1 if sample.policy_version is None else sample.policy_version] * length,
        "sample_index": [index] * length,
        **_draw_rows(sample, in_completion, first),
    }


def _draw_rows(sample: TrainSample, in_completion: list[bool], first: int) -> dict[str, list[int]]:
    """Each target's draw: its sample's seed, noise stream and position where the target is a trained token of a
    sample with draws, else -1."""
    draws = sample.draws
    if draws is None:
        none = [-1] * len(in_completion)
        return {"draw_seeds": none, "draw_streams": none, "draw_positions": none}
    if not len(draws.streams) == len(draws.positions) == len(sample.completion_ids):
        raise ValueError(f"{len(draws.streams)} draw streams for {len(sample.completion_ids)} completion tokens")
    return {
        "draw_seeds": [draws.seed if m else -1 for m in in_completion],
        "draw_streams": [draws.streams[j - first] if m else -1 for j, m in enumerate(in_completion)],
        "draw_positions": [draws.positions[j - first] if m else -1 for j, m in enumerate(in_completion)],
    }


def _sample_images(sample: TrainSample, vision: VisionPacking) -> _SampleImages:
    """The sample's pixels and positions; ValueError when its image tokens do not stand for exactly its images."""
    input_ids = torch.tensor(sample.prompt_ids + sample.completion_ids, dtype=torch.long)
    vision.inputs.check_image_tokens(input_ids, sample.images, "a sample")
    mask = vision.inputs.image_token_mask(input_ids)
    pixels = vision.inputs.pixel_inputs(sample.images) if sample.images else None
    positions = vision.positions(input_ids, mask, None if pixels is None else pixels.image_grid_thw)
    if positions.shape != (3, len(input_ids)):
        raise ValueError(f"positions of shape {tuple(positions.shape)} for a sample of {len(input_ids)} tokens")
    return _SampleImages(positions.long(), pixels)


def _idle_sample(vision: VisionPacking) -> TrainSample:
    """A sample that only shows :data:`IDLE_IMAGE`, with nothing to learn (no completion)."""
    num_tokens = vision.inputs.num_image_tokens(IDLE_IMAGE)
    return TrainSample(prompt_ids=[vision.inputs.image_token_id] * num_tokens, completion_ids=[], images=(IDLE_IMAGE,))


@dataclass(frozen=True)
class _Pool:
    """The samples micro-batches are made of: a batch's, then (a vision-language run) the idle sample, whose row is
    padding as far as counts go; with each one's images."""

    samples: list[TrainSample]
    num_real: int
    images: list[_SampleImages] | None = None
    vision: VisionPacking | None = None

    @staticmethod
    def of(samples: list[TrainSample], vision: VisionPacking | None) -> _Pool:
        if vision is None:
            if any(sample.images for sample in samples):
                raise ValueError("a sample shows images, but the policy reads text only")
            return _Pool(samples, len(samples))
        pool = [*samples, _idle_sample(vision)]
        return _Pool(pool, len(samples), [_sample_images(sample, vision) for sample in pool], vision)

    @property
    def idle(self) -> int:
        return len(self.samples) - 1

    def index(self, i: int) -> int:
        """The batch's index of pool sample ``i`` (-1: the idle sample, which is no sample of the batch)."""
        return i if i < self.num_real else -1

    def shows_images(self, ids: list[int]) -> bool:
        return self.images is not None and any(self.images[i].pixels is not None for i in ids)


_DTYPES = {
    "input_ids": torch.long,
    "position_ids": torch.long,
    "targets": torch.long,
    "loss_mask": torch.bool,
    "advantages": torch.float32,
    "inference_logprobs": torch.float32,
    "policy_versions": torch.long,
    "sample_index": torch.long,
    "draw_seeds": torch.long,
    "draw_streams": torch.long,
    "draw_positions": torch.long,
}
_FILL = {
    "input_ids": None,
    "policy_versions": -1,
    "sample_index": -1,
    "draw_seeds": -1,
    "draw_streams": -1,
    "draw_positions": -1,
}
"""Padding of each per-token tensor (None: the pad token); the rest pad with 0."""


def _tensors(rows: list[list[dict[str, list[Any]]]], width: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Rows of concatenated samples, each padded at its end to ``width``."""
    tensors: dict[str, torch.Tensor] = {}
    for key, dtype in _DTYPES.items():
        fill = _FILL.get(key, 0)
        fill = pad_id if fill is None else fill
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


def _vision_tensors(
    pool: _Pool, rows: list[list[int]], input_ids: torch.Tensor, packed: bool
) -> dict[str, torch.Tensor | None]:
    """A vision-language micro-batch's positions and image inputs (its rows ``rows`` of pool indices)."""
    assert pool.images is not None and pool.vision is not None
    width = input_ids.shape[1]
    positions = torch.zeros((3, len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            length = pool.samples[i].num_tokens
            positions[:, r, start : start + length] = pool.images[i].positions
            start += length
        if packed:  # the end-of-row padding counts from 0, as the text positions' does
            positions[:, r, start:] = torch.arange(width - start)
    shown = [pixels for row in rows for i in row if (pixels := pool.images[i].pixels) is not None]
    return {
        "position_ids": positions,
        "pixel_values": torch.cat([p.pixel_values for p in shown]) if shown else None,
        "image_grid_thw": torch.cat([p.image_grid_thw for p in shown]) if shown else None,
        "mm_token_type_ids": pool.vision.inputs.image_token_mask(input_ids),
    }


def _counts(pool: _Pool, rows: list[list[int]]) -> dict[str, Any]:
    ids = [i for row in rows for i in row if i < pool.num_real]
    real = sum(pool.samples[i].num_tokens for i in ids)
    return {"num_samples": len(ids), "sample_ids": ids, "num_real_tokens": real}


def _with_idle_row(pool: _Pool, rows: list[list[int]]) -> list[list[int]]:
    """``rows``, and in a vision-language run one row more with the idle image when they show none."""
    if pool.vision is None or pool.shows_images([i for row in rows for i in row]):
        return rows
    return [*rows, [pool.idle]]


def _packed(pool: _Pool, rows: list[list[int]], pad_id: int) -> MicroBatch:
    rows = _with_idle_row(pool, rows)
    samples = pool.samples
    sample_rows = [[_sample_rows(samples[i], pool.index(i)) for i in row] for row in rows]
    width = max(sum(samples[i].num_tokens for i in row) for row in rows)
    tensors: dict[str, Any] = dict(_tensors(sample_rows, width, pad_id))
    # Position ids restart at 0 for each sample; the end-of-row padding counts from 0 as well.
    for r, row in enumerate(rows):
        used = sum(samples[i].num_tokens for i in row)
        tensors["position_ids"][r, used:] = torch.arange(width - used)
    if pool.vision is not None:
        tensors.update(_vision_tensors(pool, rows, tensors["input_ids"], packed=True))
    mask = _block_causal_mask(sample_rows, width)
    return MicroBatch(**tensors, attention_mask=mask, **_counts(pool, rows))


def _padded(pool: _Pool, ids: list[int], pad_id: int) -> MicroBatch:
    rows = _with_idle_row(pool, [[i] for i in ids])
    lengths = [pool.samples[i].num_tokens for (i,) in rows]
    width = max(lengths)
    tensors: dict[str, Any] = dict(
        _tensors([[_sample_rows(pool.samples[i], pool.index(i))] for (i,) in rows], width, pad_id)
    )
    if pool.vision is not None:
        tensors.update(_vision_tensors(pool, rows, tensors["input_ids"], packed=False))
    attention = torch.tensor([[1] * length + [0] * (width - length) for length in lengths])
    return MicroBatch(**tensors, attention_mask=attention, **_counts(pool, rows))


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
    vision: VisionPacking | None = None,
) -> list[MicroBatch]:
    """Micro-batches of at most ``micro_batch_tokens`` tokens (padding included) each, save for the idle image row
    below.

    Packed: samples go into rows of at most ``row_tokens`` tokens (or the longest sample, if
    longer) by first-fit-decreasing, rows into micro-batches. Unpacked (the baseline):
    consecutive samples, one per row, each padded to the longest of its micro-batch. ``vision``: the
    policy reads images (module docstring); a micro-batch that shows none has one row more (an idle image as wide
    as the micro-batch's rows, no loss), which may take it past ``micro_batch_tokens``.
    ValueError for a sample whose image tokens do not match its images, or with images and no ``vision``.
    """
    if not samples:
        return []
    pool = _Pool.of(samples, vision)
    if packed:
        longest = max(s.num_tokens for s in samples)
        # A row is at least as wide as the longest sample, so every sample fits one.
        row_capacity = min(max(row_tokens or micro_batch_tokens, longest), micro_batch_tokens)
        rows = plan_bins([s.num_tokens for s in samples], row_capacity)
        rows.sort(key=lambda row: -sum(samples[i].num_tokens for i in row))
        widths = [sum(samples[i].num_tokens for i in row) for row in rows]
        return [_packed(pool, [rows[r] for r in group], pad_id) for group in _chunk_rows(widths, micro_batch_tokens)]
    lengths = [s.num_tokens for s in samples]
    if max(lengths) > micro_batch_tokens:
        raise ValueError(f"a sample of {max(lengths)} tokens exceeds micro_batch_tokens={micro_batch_tokens}")
    groups = _chunk_rows(lengths, micro_batch_tokens)
    return [_padded(pool, group, pad_id) for group in groups]


def empty_micro_batch(vision: VisionPacking | None = None) -> MicroBatch:
    """Nothing to learn: keeps a rank's collective calls in step with the others. One token; with ``vision``, the
    idle image's row (the vision tower runs on every rank)."""
    if vision is not None:
        return _packed(_Pool.of([], vision), [], 0)
    zeros = torch.zeros((1, 1), dtype=torch.long)
    return MicroBatch(
        input_ids=zeros,
        position_ids=zeros.clone(),
        targets=zeros.clone(),
        loss_mask=torch.zeros((1, 1), dtype=torch.bool),
        advantages=torch.zeros((1, 1)),
        inference_logprobs=torch.zeros((1, 1)),
        policy_versions=torch.full((1, 1), -1, dtype=torch.long),
        sample_index=torch.full((1, 1), -1, dtype=torch.long),
        draw_seeds=torch.full((1, 1), -1, dtype=torch.long),
        draw_streams=torch.full((1, 1), -1, dtype=torch.long),
        draw_positions=torch.full((1, 1), -1, dtype=torch.long),
    )


def deal_to_ranks(
    micro_batches: list[MicroBatch], world_size: int, filler: Callable[[], MicroBatch] = empty_micro_batch
) -> list[list[MicroBatch]]:
    """Deal micro-batches to ranks, heaviest first to the lightest rank; every rank gets the same count.

    Ranks that run short get ``filler`` micro-batches (:func:`empty_micro_batch`), since FSDP's collectives
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
        batches.extend(filler() for _ in range(count - len(batches)))
    return per_rank
