"""Verifiable sampling: Gumbel noise from a counter-based hash, identical on every device.

A token is drawn as ``argmax(logits / T + g)`` where ``g[v] = -log(-log(u))`` and ``u`` is
a uniform number hashed from (seed, stream, position, token id). The Gumbel-max trick makes
that a sample from ``softmax(logits / T)``; because ``u`` is a pure function of integers, a
validator can replay the exact draw from recomputed logits. ``stream`` separates samples
within a task (``sample_stream(prompt_index, sample_index)``, and ``turn_stream`` for each policy turn of a
multi-turn episode); ``position`` counts the completion tokens drawn so far in the turn.

The hash is a 32-bit multiply-xorshift mixer evaluated in int64 with every product kept
below 2^63 (values < 2^32, constants < 2^31), so CPU and CUDA integer arithmetic give the
same bits without relying on signed overflow; the final transform runs in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from protocol.schemas import MAX_EPISODE_TURNS

_MASK32 = 0xFFFFFFFF
_MUL_A = 0x7FEB352D
_MUL_B = 0x2C1B3C6D
_MUL_C = 0x297A2D39
_GOLDEN = 0x1E3779B9
MAX_GROUP_STREAMS = 1 << 16


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)  # a new tensor: the steps below work in place (a third less time on big blocks)
    x.mul_(_MUL_A).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(_MUL_B).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(_MUL_C).bitwise_and_(_MASK32)
    return x.bitwise_xor_(x >> 16)


def _absorb(state: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    return _mix32(((state ^ (word & _MASK32)) + _GOLDEN) & _MASK32)


def sample_stream(prompt_index: int, sample_index: int) -> int:
    """The noise stream of one sample of a task: distinct for every (prompt, sample) pair."""
    if not 0 <= sample_index < MAX_GROUP_STREAMS:
        raise ValueError(f"sample_index must be in [0, {MAX_GROUP_STREAMS})")
    return prompt_index * MAX_GROUP_STREAMS + sample_index


def turn_stream(prompt_index: int, sample_index: int, turn: int) -> int:
    """The noise stream of policy turn ``turn`` (0-based) of one sample's episode: turn 0's is the sample's own
    :func:`sample_stream`, each later turn's is distinct from every stream of the task (streams are 64-bit)."""
    if not 0 <= turn < MAX_EPISODE_TURNS:
        raise ValueError(f"turn must be in [0, {MAX_EPISODE_TURNS})")
    return sample_stream(prompt_index, sample_index) + (turn << 32)


def stream_states(seeds: Sequence[int], streams: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """The hash state of each row after absorbing its (seed, stream): int64 (rows,), reusable at every position."""
    if any(not 0 <= seed < 2**63 for seed in seeds):
        raise ValueError("seed must be in [0, 2^63)")
    streams = streams.to(device=device, dtype=torch.int64).reshape(-1)
    if len(seeds) != streams.numel():
        raise ValueError(f"need one seed per row: {len(seeds)} seeds for {streams.numel()} rows")
    states = torch.empty_like(streams)
    seed_of_row = torch.tensor(list(seeds), dtype=torch.int64, device=device)
    for seed in sorted(set(seeds)):
        rows = (seed_of_row == seed).nonzero().reshape(-1)
        group = streams[rows]
        state = torch.full_like(group, _mix32(torch.tensor(seed & _MASK32)).item())
        state = _absorb(state, torch.full_like(group, seed >> 32))
        state = _absorb(state, group)
        states[rows] = _absorb(state, group >> 32)
    return states


def bits_at(states: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Hash bits (rows, vocab_size) at ``positions`` for rows whose (seed, stream) states are ``states``."""
    state = _absorb(states.reshape(-1, 1), positions.to(device=states.device, dtype=torch.int64).reshape(-1, 1))
    return _absorb(state, torch.arange(vocab_size, device=states.device, dtype=torch.int64).reshape(1, -1))


def uniform_bits(
    seed: int, streams: torch.Tensor, positions: torch.Tensor, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The 32-bit hash of (seed, stream, position, token id), int64 in [0, 2^32), shape (rows, vocab_size)."""
    streams = streams.reshape(-1)
    return bits_at(stream_states([seed] * streams.numel(), streams, device), positions, vocab_size)


def uniform_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1), float64, from hash bits."""
    return (bits.to(torch.float64) + 0.5) / 2.0**32


def gumbel_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise, float32, from hash bits."""
    return (-torch.log(-torch.log(uniform_of_bits(bits)))).to(torch.float32)


def stream_indices(stream: int) -> tuple[int, int]:
    """(prompt_index, sample_index) of a noise stream: the inverse of :func:`sample_stream`."""
    return divmod(stream, MAX_GROUP_STREAMS)


def uniform_noise(
    seed: int, streams: torch.Tensor, positions: torch.Tensor, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Uniform numbers in (0, 1), float64, shape (rows, vocab_size); row i is (streams[i], positions[i])."""
    return uniform_of_bits(uniform_bits(seed, streams, positions, vocab_size, device))


def gumbel_noise(
    seed: int, streams: torch.Tensor, positions: torch.Tensor, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Standard Gumbel noise, float32, shape (rows, vocab_size)."""
    return gumbel_of_bits(uniform_bits(seed, streams, positions, vocab_size, device))


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
    return noisy_scores_at(logits, temperatures, stream_states(seeds, streams, logits.device), positions)


def noisy_scores_at(
    logits: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """:func:`noisy_scores_rows` from precomputed :func:`stream_states` (what an engine keeps per sample)."""
    temperatures = temperatures.to(device=logits.device, dtype=torch.float32).reshape(-1)
    if bool((temperatures <= 0).any()):
        raise ValueError("verifiable sampling needs temperature > 0")
    scores = logits.to(torch.float32) / temperatures.reshape(-1, 1)
    return scores + gumbel_of_bits(bits_at(states, positions, logits.shape[-1]))


_REPLAY_BLOCK_ELEMENTS = 1 << 17  # rows replayed together: a block's hash stays in cache
_REPLAY_MARGIN = 1e-3  # slack on the pruning bounds, far above float rounding of the scores
# The largest noise any hash can give (all bits set): a token whose tempered logit is further than
# this below the claimed token's noisy score can never beat it, whatever its hash.
_MAX_GUMBEL = float(gumbel_of_bits(torch.tensor([_MASK32], dtype=torch.int64))[0])


def _absorb_pairs(states: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """:func:`_absorb` of ``states`` and ``words`` (broadcast together), int64; the validator's replay hashes with it.

    On CPU the same bits come from uint32 numpy arithmetic: a multiply that wraps modulo 2^32 is
    the int64 product masked to 32 bits, and shifts of unsigned words are the logical shifts of
    values below 2^32. Half the memory and native vector multiplies make it several times cheaper
    than the int64 torch ops, which stay the definition (and run on other devices).
    """
    if states.device.type != "cpu" or words.device.type != "cpu":
        return _absorb(states, words)
    x = np.bitwise_xor(states.numpy().astype(np.uint32), (words.numpy() & _MASK32).astype(np.uint32))
    x += np.uint32(_GOLDEN)
    x ^= x >> np.uint32(16)
    x *= np.uint32(_MUL_A)
    x ^= x >> np.uint32(15)
    x *= np.uint32(_MUL_B)
    x ^= x >> np.uint32(15)
    x *= np.uint32(_MUL_C)
    x ^= x >> np.uint32(16)
    return torch.from_numpy(x.astype(np.int64))


def sampling_gaps(
    logits: torch.Tensor, temperature: float, seed: int, stream: int, token_ids: torch.Tensor
) -> torch.Tensor:
    """How far each claimed token's noisy score is below the best one (0 when it is the noisy argmax).

    ``logits`` (n, vocab) are the recomputed logits that drew completion tokens 0..n-1 of one
    sample; positions are 0..n-1 on ``stream``. :func:`replay_gaps` for one sample.
    """
    if temperature <= 0:
        raise ValueError("verifiable sampling needs temperature > 0")
    num_tokens = logits.shape[0]
    states = stream_states([seed], torch.tensor([stream]), logits.device).expand(num_tokens)
    positions = torch.arange(num_tokens, dtype=torch.int64, device=logits.device)
    return replay_gaps(logits.to(torch.float32) / temperature, states, positions, token_ids)


def replay_gaps(
    scaled: torch.Tensor, states: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """:func:`sampling_gaps` for rows of many samples at once (a validator's whole batch).

    Row i of ``scaled`` is ``logits / T`` in float32 of the sample whose :func:`stream_states`
    is ``states[i]``, at completion position ``positions[i]``, and claims ``token_ids[i]``. The
    scores are exactly those of :func:`noisy_scores_at`, but only tokens that could beat the
    claimed one are looked at, in two prunings: a token whose tempered logit is more than the
    largest possible noise below the claimed score never counts; of the rest, the Gumbel
    transform (two float64 logs) is only evaluated where the hash bits clear the bound
    ``g_v >= claimed - max(logits / T)`` (one integer comparison). Where most of a block is
    reachable (a small or flat vocabulary) every token of it is hashed, which is cheaper than
    listing the reachable ones; the tokens considered, and so the gaps, are the same either way.
    A validator accepts a token whose gap is within a calibrated tolerance, since honest
    recomputation differs from generation by rounding.
    """
    num_rows, vocab_size = scaled.shape
    device = scaled.device
    tokens = token_ids.to(device=device, dtype=torch.int64).reshape(-1, 1)
    # The (seed, stream, position) part of each row's hash, as in bits_at.
    row_states = _absorb(
        states.to(device).reshape(-1, 1), positions.to(device=device, dtype=torch.int64).reshape(-1, 1)
    )
    vocabulary = torch.arange(vocab_size, dtype=torch.int64, device=device).reshape(1, -1)
    gaps = torch.empty(num_rows, dtype=torch.float32, device=device)
    rows_per_block = max(1, _REPLAY_BLOCK_ELEMENTS // vocab_size)
    for start in range(0, num_rows, rows_per_block):
        end = min(start + rows_per_block, num_rows)
        block, block_states = scaled[start:end], row_states[start:end]
        claimed_logits = block.gather(1, tokens[start:end]).reshape(-1)
        claimed = claimed_logits + gumbel_of_bits(_absorb(block_states, tokens[start:end])).reshape(-1)
        reachable = block >= (claimed - _MAX_GUMBEL - _REPLAY_MARGIN).reshape(-1, 1)
        needed = (claimed - block.max(dim=-1).values - _REPLAY_MARGIN).to(torch.float64)
        # g >= needed  <=>  u >= exp(-exp(-needed))  <=>  bits >= that * 2^32 - 0.5
        min_bits = torch.floor(torch.exp(-torch.exp(-needed)) * 2.0**32 - 0.5).clamp(min=0).to(torch.int64)
        if 4 * int(reachable.sum()) >= reachable.numel():
            bits = _absorb_pairs(block_states, vocabulary)
            rows, columns = (reachable & (bits >= min_bits.reshape(-1, 1))).nonzero(as_tuple=True)
            bits = bits[rows, columns]
        else:
            rows, columns = reachable.nonzero(as_tuple=True)
            bits = _absorb_pairs(block_states[rows, 0], columns)
            contender = bits >= min_bits[rows]
            rows, columns, bits = rows[contender], columns[contender], bits[contender]
        scores = block[rows, columns] + gumbel_of_bits(bits)
        best = torch.full_like(claimed, -torch.inf).scatter_reduce(0, rows, scores, reduce="amax")
        gaps[start:end] = best - claimed
    return gaps


def _hash_words(row_states: np.ndarray, vocabulary: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """:func:`_absorb` of each row's state with every token id of ``vocabulary``, uint32, into ``out`` (rows, vocab).

    The same bits as the int64 definition (see :func:`_absorb_pairs`), in place in preallocated
    buffers: a row block of a 151,936-token vocabulary stays in cache through all the steps.
    """
    np.bitwise_xor(vocabulary.reshape(1, -1), row_states.reshape(-1, 1), out=out)
    out += np.uint32(_GOLDEN)
    for shift, multiplier in ((16, _MUL_A), (15, _MUL_B), (15, _MUL_C)):
        np.right_shift(out, np.uint32(shift), out=scratch)
        out ^= scratch
        out *= np.uint32(multiplier)
    np.right_shift(out, np.uint32(16), out=scratch)
    out ^= scratch
    return out


_LN2 = math.log(2.0)
_DRAW_BLOCK_ELEMENTS = 1 << 17


def _noise_bounds(bits: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """An upper bound (float32, into ``out``) on the Gumbel noise of each hash word, without a logarithm.

    With ``u = (bits + 0.5) / 2^32`` and ``w = 2^32 - 1 - bits``: ``-log(u) >= 1 - u > w / 2^32``, so
    ``g = -log(-log(u)) < (32 - log2 w) ln 2``. ``x = w >> 8`` is exact in float32, ``2^e * m`` with
    ``m`` in [1, 2), whose bits read as an integer ``B`` are ``(e + 127 + m - 1) * 2^23``; as
    ``log2 m >= m - 1`` and ``log2 w >= log2 x + 8``, ``g < (151 - B / 2^23) ln 2`` (the classic
    bit-pattern logarithm, used as a bound). ``w < 256`` gives ``x = 0`` and a bound of 104 nats,
    loose but true. Elsewhere it exceeds the noise by less than 0.1 nats where the noise is large,
    which is where a token can win; float32 rounding of the steps is below 1e-4 nats.
    """
    np.bitwise_xor(bits, np.uint32(_MASK32), out=scratch)
    scratch >>= np.uint32(8)
    np.copyto(out, scratch.view(np.int32), casting="unsafe")  # float32(x), exact: x < 2^24
    pattern = scratch.view(np.float32)
    np.copyto(pattern, out.view(np.int32), casting="unsafe")  # B, the bits of float32(x) as a number
    np.multiply(pattern, np.float32(-_LN2 / 2**23), out=out)
    out += np.float32(151 * _LN2)
    return out


def draw_tokens_at(
    logits: torch.Tensor, temperatures: torch.Tensor, states: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``noisy_scores_at(logits, temperatures, states, positions).argmax(-1)``: the same tokens, cheaper on CPU.

    The definition takes two float64 logs for every token of the vocabulary; here every token is
    hashed (uint32, in cache-sized blocks) but the logs are taken only for contenders. A token's
    score is at most its tempered logit plus :func:`_noise_bounds` of its hash; the token with the
    highest such bound gets its exact score ``s0``, and only tokens whose bound reaches ``s0`` (less
    a margin far above float32 rounding) can score ``>= s0``, so the maximum and its first index,
    which ``argmax`` returns, are among them. Their scores are computed with the definition's own
    operations (the float32 division, :func:`gumbel_of_bits`, the float32 sum), so the token drawn
    is the definition's. Rows with a non-finite logit, and tensors on other devices, take the
    definition itself.
    """
    temperatures = temperatures.to(device=logits.device, dtype=torch.float32).reshape(-1)
    if bool((temperatures <= 0).any()):
        raise ValueError("verifiable sampling needs temperature > 0")
    if logits.device.type != "cpu":
        return noisy_scores_at(logits, temperatures, states, positions).argmax(dim=-1)
    num_rows, vocab_size = logits.shape
    scaled = (logits.to(torch.float32) / temperatures.reshape(-1, 1)).contiguous()
    row_states = _absorb(states.reshape(-1, 1), positions.to(dtype=torch.int64).reshape(-1, 1)).reshape(-1)
    words = row_states.numpy().astype(np.uint32)
    tokens = torch.empty(num_rows, dtype=torch.int64)
    rows_per_block = max(1, _DRAW_BLOCK_ELEMENTS // vocab_size)
    block_shape = (min(rows_per_block, num_rows), vocab_size)
    bits, scratch = np.empty(block_shape, dtype=np.uint32), np.empty(block_shape, dtype=np.uint32)
    bounds = np.empty(block_shape, dtype=np.float32)
    reached = np.empty(block_shape, dtype=np.bool_)
    vocabulary = np.arange(vocab_size, dtype=np.uint32)
    for start in range(0, num_rows, rows_per_block):
        end = min(start + rows_per_block, num_rows)
        count = end - start
        block = scaled[start:end]
        block_np = block.numpy()
        maxima = block_np.max(axis=1)
        if not bool(np.isfinite(maxima).all()):
            tokens[start:end] = noisy_scores_at(
                logits[start:end], temperatures[start:end], states[start:end], positions[start:end]
            ).argmax(dim=-1)
            continue
        block_bits = _hash_words(words[start:end], vocabulary, bits[:count], scratch[:count])
        block_bounds = _noise_bounds(block_bits, bounds[:count], scratch[:count])
        block_bounds += block_np
        first = torch.from_numpy(block_bounds.argmax(axis=1).astype(np.int64)).reshape(-1, 1)
        first_bits = torch.from_numpy(np.take_along_axis(block_bits, first.numpy(), axis=1).astype(np.int64))
        first_scores = (block.gather(1, first) + gumbel_of_bits(first_bits)).reshape(-1).to(torch.float64)
        # Rounding of the float32 sums and of the bound is below 1e-6 of the magnitudes involved.
        margins = _REPLAY_MARGIN + 1e-5 * (first_scores.abs() + torch.from_numpy(np.abs(maxima)).double() + 128.0)
        thresholds = (first_scores - margins).to(torch.float32).numpy()
        np.greater_equal(block_bounds, thresholds.reshape(-1, 1), out=reached[:count])
        flat = np.flatnonzero(reached[:count])
        rows, columns = np.divmod(flat, vocab_size)
        contender_bits = torch.from_numpy(block_bits.reshape(-1)[flat].astype(np.int64))
        rows_t, columns_t = torch.from_numpy(rows.astype(np.int64)), torch.from_numpy(columns.astype(np.int64))
        scores = block[rows_t, columns_t] + gumbel_of_bits(contender_bits)
        # The first index of each row's maximum, as argmax over the whole row would give.
        best = torch.full((count,), -torch.inf).scatter_reduce(0, rows_t, scores, reduce="amax")
        winners = scores == best[rows_t]
        tokens[start:end] = torch.full((count,), vocab_size, dtype=torch.int64).scatter_reduce(
            0, rows_t[winners], columns_t[winners], reduce="amin"
        )
    return tokens
