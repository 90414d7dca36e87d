"""Verifiable sampling: deterministic, pinned bits, and a true sample of softmax(logits / T)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toploc.sampling import (
    _absorb,
    _absorb_pairs,
    _noise_bounds,
    bits_at,
    draw_tokens,
    draw_tokens_at,
    gumbel_of_bits,
    noisy_scores,
    noisy_scores_at,
    noisy_scores_rows,
    replay_gaps,
    sample_stream,
    sampling_gaps,
    stream_indices,
    stream_states,
    turn_stream,
    uniform_noise,
)

# Pinned outputs: the noise is part of the protocol (workers and validators on different
# machines and versions must agree), so any change to the hash must fail this test.
PINNED_ROW = [0.39325542154256254, 0.4574378450633958, 0.08258220844436437, 0.1053941628197208]


def test_noise_is_pinned() -> None:
    u = uniform_noise(12345, torch.tensor([0]), torch.tensor([0]), 4)
    assert u[0].tolist() == pytest.approx(PINNED_ROW, abs=1e-15)


def test_noise_is_deterministic_and_independent_of_batching() -> None:
    streams = torch.tensor([sample_stream(p, s) for p in range(3) for s in range(4)])
    positions = torch.arange(12)
    together = uniform_noise(7, streams, positions, 50)
    one_by_one = torch.cat([uniform_noise(7, streams[i : i + 1], positions[i : i + 1], 50) for i in range(12)])
    assert torch.equal(together, one_by_one)
    assert not torch.equal(uniform_noise(8, streams, positions, 50), together)


def test_noise_differs_across_streams_positions_and_tokens() -> None:
    u = uniform_noise(1, torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1]), 1000)
    assert torch.unique(u).numel() == u.numel()
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0


def test_draws_follow_softmax_of_tempered_logits() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    temperature = 0.7
    num_draws = 40000
    rows = logits.expand(num_draws, -1)
    tokens = draw_tokens(rows, temperature, seed=99, streams=torch.zeros(num_draws), positions=torch.arange(num_draws))
    frequencies = torch.bincount(tokens, minlength=4).double() / num_draws
    expected = torch.softmax(logits.double() / temperature, dim=-1)
    assert torch.allclose(frequencies, expected, atol=0.01), (frequencies, expected)


def test_stream_indices_invert_sample_stream() -> None:
    assert stream_indices(sample_stream(7, 3)) == (7, 3)
    assert stream_indices(sample_stream(0, 0)) == (0, 0)


def test_sample_stream_bounds() -> None:
    assert sample_stream(0, 1) != sample_stream(1, 0)
    with pytest.raises(ValueError):
        sample_stream(0, 1 << 16)
    with pytest.raises(ValueError):
        draw_tokens(torch.zeros(1, 3), 0.0, 1, torch.zeros(1), torch.zeros(1))


def test_each_turn_of_an_episode_draws_its_own_noise() -> None:
    assert turn_stream(7, 3, 0) == sample_stream(7, 3)
    streams = {turn_stream(p, s, t) for p in (0, 1, 255) for s in (0, 1, 63) for t in (0, 1, 255)}
    assert len(streams) == 27
    noise = uniform_noise(5, torch.tensor([turn_stream(2, 1, t) for t in range(4)]), torch.zeros(4), 64)
    assert len({tuple(row.tolist()) for row in noise}) == 4
    with pytest.raises(ValueError, match="turn must be in"):
        turn_stream(0, 0, 256)


@pytest.mark.parametrize(("vocab_size", "spread"), [(7, 1.0), (1024, 1.3), (1024, 8.0), (5000, 3.0)])
def test_replay_gaps_equal_the_full_computation(vocab_size: int, spread: float) -> None:
    """sampling_gaps prunes the vocabulary by a bound on the hash; the gaps must not change at all."""
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(150, vocab_size, generator=generator) * spread
    positions = torch.arange(150)
    streams = torch.full((150,), sample_stream(3, 1))
    scores = noisy_scores(logits, 0.9, 77, streams, positions)
    tokens = scores.argmax(dim=-1)
    tokens[::5] = torch.randint(0, vocab_size, (30,), generator=generator)  # some claims off the draw
    expected = scores.max(dim=-1).values - scores.gather(1, tokens.reshape(-1, 1)).reshape(-1)
    gaps = sampling_gaps(logits, 0.9, 77, sample_stream(3, 1), tokens)
    assert torch.equal(gaps, expected)
    assert float(gaps[1::5].max()) == 0.0
    assert bool((noisy_scores_rows(logits, torch.full((150,), 0.9), [77] * 150, streams, positions) == scores).all())


def test_uint32_hash_equals_the_int64_definition() -> None:
    """The replay hashes with numpy uint32 words on CPU; every bit must be that of the int64 torch mixer."""
    generator = torch.Generator().manual_seed(5)
    edges = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1], dtype=torch.int64)
    states = torch.cat([edges, torch.randint(0, 2**32, (2000,), generator=generator)])
    words = torch.cat([edges.flip(0), torch.randint(0, 2**40, (2000,), generator=generator)])
    assert torch.equal(_absorb_pairs(states, words), _absorb(states, words))
    columns = torch.arange(300).reshape(1, -1)
    assert torch.equal(_absorb_pairs(states.reshape(-1, 1), columns), _absorb(states.reshape(-1, 1), columns))


@pytest.mark.parametrize(("vocab_size", "spread"), [(7, 1.0), (320, 1.0), (1024, 8.0), (5000, 3.0), (5000, 40.0)])
def test_batched_replay_equals_each_sample_replayed_alone(vocab_size: int, spread: float) -> None:
    """replay_gaps over rows of many samples (own temperature, seed, stream, length) = the full computation of each."""
    generator = torch.Generator().manual_seed(vocab_size + int(spread))
    lengths = [1, 40, 7, 130, 33, 2]
    temperatures = [0.7, 1.0, 1.3, 0.9, 2.0, 0.35]
    seeds = [77, 77, 2**40 + 3, 5, 2**63 - 1, 0]
    streams = [sample_stream(p, s) for p, s in [(0, 0), (0, 1), (3, 2), (9, 0), (1, 65535), (2, 7)]]
    logits = [torch.randn(n, vocab_size, generator=generator) * spread for n in lengths]
    tokens, expected = [], []
    for rows, temperature, seed, stream in zip(logits, temperatures, seeds, streams, strict=True):
        n = rows.shape[0]
        scores = noisy_scores(rows, temperature, seed, torch.full((n,), stream), torch.arange(n))
        claimed = scores.argmax(dim=-1)
        claimed[::3] = torch.randint(0, vocab_size, (len(claimed[::3]),), generator=generator)  # some off the draw
        tokens.append(claimed)
        expected.append(scores.max(dim=-1).values - scores.gather(1, claimed.reshape(-1, 1)).reshape(-1))
        assert torch.equal(sampling_gaps(rows, temperature, seed, stream, claimed), expected[-1])
    repeats = torch.tensor(lengths)
    scaled = torch.cat(logits) / torch.tensor(temperatures).repeat_interleave(repeats).reshape(-1, 1)
    states = stream_states(seeds, torch.tensor(streams)).repeat_interleave(repeats)
    positions = torch.cat([torch.arange(n) for n in lengths])
    gaps = replay_gaps(scaled, states, positions, torch.cat(tokens))
    assert torch.equal(gaps, torch.cat(expected))


def test_noise_bounds_are_upper_bounds_of_the_noise() -> None:
    """The pruned sampler's bound must hold for every hash word, binade edges and both ends included."""
    edges = [0, 1, 2, 3, 2**32 - 1, 2**32 - 2, 2**32 - 3]
    for k in range(1, 33):
        edges += [2**32 - 2**k + d for d in (-2, -1, 0, 1, 2) if 0 <= 2**32 - 2**k + d < 2**32]
    random_words = torch.randint(0, 2**32, (1 << 20,), generator=torch.Generator().manual_seed(3))
    bits = torch.cat([torch.tensor(edges, dtype=torch.int64), random_words])
    words = bits.numpy().astype(np.uint32).reshape(1, -1)
    bounds = _noise_bounds(words, np.empty(words.shape, np.float32), np.empty_like(words))
    noise = gumbel_of_bits(bits).numpy()
    assert bool((bounds[0] + 1e-4 >= noise).all())  # float32 rounding of the bound's steps is below 1e-4
    high = (noise > 3.0) & (bits.numpy() < 2**32 - 2**16)  # where a token can win, the bound is close
    assert float((bounds[0][high] - noise[high]).max()) < 0.1


def _reference_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    return noisy_scores_at(logits, temperatures, states, positions).argmax(dim=-1)


@pytest.mark.parametrize(
    ("vocab_size", "num_rows", "spread"),
    [(2, 300, 1.0), (7, 300, 0.5), (1000, 200, 1.3), (5000, 64, 8.0), (5000, 64, 40.0), (151_936, 6, 2.0)],
)
def test_pruned_draw_equals_the_definition(vocab_size: int, num_rows: int, spread: float) -> None:
    """draw_tokens_at takes logs only for contenders; every token must be the full definition's argmax."""
    for trial in range(6):
        generator = torch.Generator().manual_seed(1000 * trial + vocab_size)
        logits = torch.randn(num_rows, vocab_size, generator=generator) * spread
        if trial % 3 == 1:
            logits = logits.round()  # many exact ties in the logits
        elif trial % 3 == 2:
            logits[: num_rows // 2] = logits[: num_rows // 2, :1]  # flat rows: the noise alone decides
        temperatures = torch.rand(num_rows, generator=generator) * 2.0 + 0.01
        temperatures[::4] = 1.0
        seeds = [trial, 2**63 - 1 - trial, 2**40 + trial]
        streams = torch.tensor([sample_stream(i % 5, i % 3) for i in range(num_rows)])
        states = stream_states([seeds[i % 3] for i in range(num_rows)], streams)
        positions = torch.randint(0, 1 << 20, (num_rows,), generator=generator)
        expected = _reference_tokens(logits, temperatures, states, positions)
        assert torch.equal(draw_tokens_at(logits, temperatures, states, positions), expected)


def test_pruned_draw_breaks_exact_ties_like_argmax() -> None:
    """Two tokens with the same logit and the same noise: argmax (and so the sampler) takes the first."""
    vocab_size = 4096
    states = stream_states([9] * 64, torch.arange(64))
    positions = torch.zeros(64, dtype=torch.int64)
    bits = bits_at(states, positions, vocab_size)
    noise = gumbel_of_bits(bits)
    logits = -noise  # every noisy score is 0 up to rounding: the tie is in the last bits
    expected = _reference_tokens(logits, torch.ones(64), states, positions)
    assert torch.equal(draw_tokens_at(logits, torch.ones(64), states, positions), expected)
    scores = noisy_scores_at(logits, torch.ones(64), states, positions)
    assert int((scores == scores.max(dim=-1, keepdim=True).values).sum(dim=-1).max()) > 1  # ties happened


def test_pruned_draw_of_non_finite_rows_is_the_definition() -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2))
    logits[0, 17] = torch.nan
    logits[1, [3, 90]] = torch.inf
    logits[2, :] = -torch.inf
    logits[3, :150] = -torch.inf
    states = stream_states([4] * 6, torch.arange(6))
    positions = torch.arange(6)
    expected = _reference_tokens(logits, torch.ones(6), states, positions)
    assert torch.equal(draw_tokens_at(logits, torch.ones(6), states, positions), expected)
    with pytest.raises(ValueError, match="temperature > 0"):
        draw_tokens_at(logits, torch.zeros(6), states, positions)
