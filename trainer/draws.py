"""The trainer's replay of each trained token's draw: was it the policy's seeded draw?

Workers draw every token as the argmax of ``logits / T + g``, with Gumbel noise ``g`` hashed from the lease's
seed, the sample's noise stream, the token's position and each token id (:mod:`toploc.sampling`). Validators
replay that on the samples they recompute; the trainer replays it on every token it trains, with the logits it
computes anyway (the training forward's for the version being trained, the recompute's for older versions): a
token whose noisy score is more than ``tolerance`` below the best (:func:`toploc.sampling.replay_gaps`) was not
drawn by this policy under this seed, whatever a validator said of it. Honest tokens differ from their replay by
rounding only, which the run precision's calibrated sampling tolerance covers, as it does for validators.
"""

from __future__ import annotations

import torch

from toploc.sampling import replay_gaps, stream_states


def draw_gaps(
    logits: torch.Tensor,
    temperature: float,
    targets: torch.Tensor,
    seeds: torch.Tensor,
    streams: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Each row's gap (float32; NaN where ``seeds`` is -1: not replayed): how far the noisy score of ``targets`` is
    below the best noisy score of its row of ``logits`` (N, vocab)."""
    gaps = torch.full((logits.shape[0],), float("nan"), dtype=torch.float32)
    chosen = (seeds >= 0).nonzero().reshape(-1)
    if chosen.numel() == 0:
        return gaps
    rows = chosen.to(logits.device)
    scaled = logits.detach()[rows].to(torch.float32) / temperature
    states = stream_states(seeds[chosen].tolist(), streams[chosen], logits.device)
    found = replay_gaps(scaled, states, positions[chosen].to(logits.device), targets[chosen].to(logits.device))
    gaps[chosen] = found.cpu()
    return gaps


def count_off_draw(gaps: torch.Tensor, sample_index: torch.Tensor, tolerance: float, counts: torch.Tensor) -> None:
    """Add to ``counts[i]`` (per sample of the batch) the replayed tokens of sample i whose gap is over
    ``tolerance``."""
    over = ~torch.isnan(gaps) & (gaps > tolerance) & (sample_index >= 0)
    if bool(over.any()):
        counts.index_add_(0, sample_index[over], torch.ones(int(over.sum()), dtype=counts.dtype))
