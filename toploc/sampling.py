"""Verifiable sampling: Gumbel noise from a counter-based hash, identical on every device.

A token is drawn as ``argmax(logits / T + g)`` where ``g[v] = -log(-log(u))`` and ``u`` is
a uniform number hashed from (seed, stream, position, token id). The Gumbel-max trick makes
that a sample from ``softmax(logits / T)``; because ``u`` is a pure function of integers, a
validator can replay the exact draw from recomputed logits. ``stream`` separates samples
within a task (``sample_stream(prompt_index, sample_index)``); ``position`` counts the
completion tokens drawn so far.

The hash is a 32-bit multiply-xorshift mixer evaluated in int64 with every product kept
below 2^63 (values < 2^32, constants < 2^31), so CPU and CUDA integer arithmetic give the
same bits without relying on signed overflow; the final transform runs in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK32 = 0xFFFFFFFF
_MUL_A = 0x7FEB352D
_MUL_B = 0x2C1B3C6D
_MUL_C = 0x297A2D39
_GOLDEN = 0x1E3779B9
MAX_GROUP_STREAMS = 1 << 16


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_C) & _MASK32
    return x ^ (x >> 16)


def _absorb(state: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    return _mix32(((state ^ (word & _MASK32)) + _GOLDEN) & _MASK32)


def sample_stream(prompt_index: int, sample_index: int) -> int:
    """The noise stream of one sample of a task: distinct for every (prompt, sample) pair."""
    if not 0 <= sample_index < MAX_GROUP_STREAMS:
        raise ValueError(f"sample_index must be in [0, {MAX_GROUP_STREAMS})")
    return prompt_index * MAX_GROUP_STREAMS + sample_index


def uniform_noise(
    seed: int, streams: torch.Tensor, positions: torch.Tensor, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Uniform numbers in (0, 1), float64, shape (rows, vocab_size); row i is (streams[i], positions[i])."""
    if not 0 <= seed < 2**63:
        raise ValueError("seed must be in [0, 2^63)")
    streams = streams.to(device=device, dtype=torch.int64).reshape(-1, 1)
    positions = positions.to(device=device, dtype=torch.int64).reshape(-1, 1)
    token_ids = torch.arange(vocab_size, device=device, dtype=torch.int64).reshape(1, -1)
    state = torch.full_like(streams, _mix32(torch.tensor(seed & _MASK32)).item())
    state = _absorb(state, torch.full_like(streams, seed >> 32))
    state = _absorb(state, streams)
    state = _absorb(state, streams >> 32)
    state = _absorb(state, positions)
    bits = _absorb(state, token_ids)
    return (bits.to(torch.float64) + 0.5) / 2.0**32


def gumbel_noise(
    seed: int, streams: torch.Tensor, positions: torch.Tensor, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Standard Gumbel noise, float32, shape (rows, vocab_size)."""
    uniform = uniform_noise(seed, streams, positions, vocab_size, device)
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


def noisy_scores(
    logits: torch.Tensor, temperature: float, seed: int, streams: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``logits / T + g`` in float32: the scores whose argmax is the drawn token."""
    if temperature <= 0:
        raise ValueError("verifiable sampling needs temperature > 0")
    noise = gumbel_noise(seed, streams, positions, logits.shape[-1], logits.device)
    return logits.to(torch.float32) / temperature + noise


def draw_tokens(
    logits: torch.Tensor, temperature: float, seed: int, streams: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """The tokens drawn for each row of ``logits`` (rows, vocab)."""
    return noisy_scores(logits, temperature, seed, streams, positions).argmax(dim=-1)


def noisy_scores_rows(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: Sequence[int],
    streams: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """``logits / T + g`` for rows that may each have their own temperature and seed (a mixed batch).

    Row i uses ``temperatures[i]`` and ``seeds[i]``; with one seed and one temperature this is
    exactly :func:`noisy_scores` (the same float32 operations in the same order), so engines and
    validators may batch rows from different tasks without changing any draw.
    """
    if len(seeds) != logits.shape[0]:
        raise ValueError(f"need one seed per row: {len(seeds)} seeds for {logits.shape[0]} rows")
    temperatures = temperatures.to(device=logits.device, dtype=torch.float32).reshape(-1)
    if bool((temperatures <= 0).any()):
        raise ValueError("verifiable sampling needs temperature > 0")
    scores = logits.to(torch.float32) / temperatures.reshape(-1, 1)
    seed_of_row = torch.tensor(seeds, dtype=torch.int64)
    for seed in sorted(set(seeds)):
        rows = (seed_of_row == seed).nonzero().reshape(-1).to(logits.device)
        scores[rows] += gumbel_noise(seed, streams[rows], positions[rows], logits.shape[-1], logits.device)
    return scores


def sampling_gaps(
    logits: torch.Tensor, temperature: float, seed: int, stream: int, token_ids: torch.Tensor
) -> torch.Tensor:
    """How far each claimed token's noisy score is below the best one (0 when it is the noisy argmax).

    ``logits`` (n, vocab) are the recomputed logits that drew completion tokens 0..n-1 of one
    sample; positions are 0..n-1 on ``stream``. A validator accepts a token whose gap is within a
    calibrated tolerance, since honest recomputation differs from generation by rounding.
    """
    num_tokens = logits.shape[0]
    positions = torch.arange(num_tokens, dtype=torch.int64)
    streams = torch.full((num_tokens,), stream, dtype=torch.int64)
    scores = noisy_scores(logits, temperature, seed, streams, positions)
    chosen = scores.gather(1, token_ids.to(device=scores.device, dtype=torch.int64).reshape(-1, 1)).reshape(-1)
    return scores.max(dim=-1).values - chosen
