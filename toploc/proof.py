"""TOPLOC proofs: build them from final hidden states, parse them, and measure them against recomputed states.

A rollout's proof commits, chunk by chunk, to the largest final hidden-state entries of its
completion (:func:`build_proofs`). A verifier measures its own recomputed states against the
committed codes (:func:`check_proofs`, one :class:`ChunkCheck` per chunk), and :mod:`toploc.verify`
holds those measures to the thresholds. The byte layout, the value code and the check are described
in docs/toploc.md ("Proof layout").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from protocol.errors import ProofError
from toploc.field import PRIME, evaluate, injective_moduli, interpolate

DEFAULT_TOPK = 128
DEFAULT_CHUNK_SIZE = 32
_NOT_MATCHED = 1 << 20  # sorts after every real mantissa difference (< 128)
_BLOCK_ELEMENTS = 1 << 18  # chunks are ranked a few at a time so each block stays in cache


@dataclass(frozen=True)
class ChunkCheck:
    """How far one chunk's commitment is from the recomputed states (all are error measures)."""

    exp_mismatches: int
    sign_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    mant_err_sum: int = 0
    """Total |mantissa difference| over the exponent-matching entries (the mean's numerator)."""


def _chunk_bounds(num_rows: int, chunk_size: int) -> list[tuple[int, int]]:  # (first row, end row)
    return [(start, min(start + chunk_size, num_rows)) for start in range(0, num_rows, chunk_size)]


# A chunk commits to at most one entry in 16 (a full chunk of a 64-wide model: 128 of 2048), so a
# short chunk commits to its large entries only: a near-zero entry's bf16 code flips under honest
# recomputation noise (~1e-6), and a 1-row tail chunk committing to every entry failed honest work.
_MAX_COMMITTED_FRACTION = 16


def _chunk_topk(num_rows: int, hidden_size: int, topk: int) -> int:
    return max(1, min(topk, num_rows * hidden_size // _MAX_COMMITTED_FRACTION))


def proof_size_bytes(
    num_tokens: int, hidden_size: int, topk: int = DEFAULT_TOPK, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> int:
    """The exact length of a valid proof for a completion of ``num_tokens`` tokens."""
    return sum(
        2 + 2 * _chunk_topk(end - start, hidden_size, topk) for start, end in _chunk_bounds(num_tokens, chunk_size)
    )


def value_codes(values: torch.Tensor) -> torch.Tensor:
    """The committed 16-bit codes (int64 in [0, 2^16)) of activation values: bf16 bit patterns."""
    return values.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _check_states(hidden_states: torch.Tensor, topk: int, chunk_size: int) -> torch.Tensor:
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
        raise ProofError(
            f"hidden states must be a (tokens, hidden) tensor, got {getattr(hidden_states, 'shape', None)}"
        )
    if hidden_states.shape[0] == 0 or hidden_states.shape[1] == 0:
        raise ProofError("no hidden states to commit to (empty completion or hidden size 0)")
    if topk < 1 or chunk_size < 1:
        raise ProofError(f"topk ({topk}) and chunk_size ({chunk_size}) must be >= 1")
    if not hidden_states.is_floating_point():
        raise ProofError(f"hidden states must be floating point, got {hidden_states.dtype}")
    states = hidden_states.detach().cpu()
    if states.dtype not in (torch.float32, torch.bfloat16):
        states = states.to(torch.float32)
    return states


@dataclass(frozen=True)
class _Group:
    """Consecutive chunks of one rollout with the same number of rows, ranked: (chunks, k) each."""

    k: int
    indices: torch.Tensor
    codes: torch.Tensor


def _rank(states: torch.Tensor, topk: int, chunk_size: int, finite_required: bool) -> list[_Group]:
    """The committed entries of every chunk of one rollout: the full chunks, then the short last one."""
    return _rank_many([states], topk, chunk_size, finite_required)[0]


def _rank_many(
    states_list: list[torch.Tensor], topk: int, chunk_size: int, finite_required: bool
) -> list[list[_Group]]:
    """:func:`_rank` of each rollout, chunks of the same shape across rollouts ranked together.

    A validator checks hundreds of rollouts at once: their full chunks share one shape, so one
    top-k over all of them replaces two small ones per rollout. Each chunk is ranked on its own
    (a row of the stacked tensor), so its entries are those of the rollout ranked alone.
    """
    spans: dict[tuple[int, int, torch.dtype], list[tuple[int, torch.Tensor]]] = {}
    for rollout, states in enumerate(states_list):
        num_rows, hidden_size = states.shape
        num_full = num_rows // chunk_size
        if num_full:
            flat = states[: num_full * chunk_size].reshape(num_full, -1)
            spans.setdefault((chunk_size, hidden_size, states.dtype), []).append((rollout, flat))
        if num_rows % chunk_size:
            flat = states[num_full * chunk_size :].reshape(1, -1)
            spans.setdefault((num_rows % chunk_size, hidden_size, states.dtype), []).append((rollout, flat))
    ranked: list[list[tuple[int, _Group]]] = [[] for _ in states_list]  # (first row of the span, its group)
    for (rows_per_chunk, hidden_size, _dtype), parts in spans.items():
        flat = torch.cat([part for _rollout, part in parts]) if len(parts) > 1 else parts[0][1]
        k = _chunk_topk(rows_per_chunk, hidden_size, topk)
        # A few chunks at a time, so each block of magnitudes stays in cache.
        rows_per_block = max(1, _BLOCK_ELEMENTS // flat.shape[1])
        indices, codes = [], []
        for start in range(0, flat.shape[0], rows_per_block):
            block = flat[start : start + rows_per_block]
            magnitudes = block.abs()
            if finite_required and not bool(torch.isfinite(magnitudes.amax()).item()):  # amax propagates NaN
                raise ProofError("hidden states contain NaN or infinity; a proof cannot commit to them")
            top = magnitudes.topk(k, dim=-1, sorted=False).indices
            indices.append(top)
            codes.append(value_codes(block.gather(1, top)))
        all_indices, all_codes = torch.cat(indices), torch.cat(codes)
        offset = 0
        for rollout, part in parts:
            num_chunks = part.shape[0]
            first_row = 0 if rows_per_chunk == chunk_size else states_list[rollout].shape[0] - rows_per_chunk
            group = _Group(k, all_indices[offset : offset + num_chunks], all_codes[offset : offset + num_chunks])
            ranked[rollout].append((first_row, group))
            offset += num_chunks
    return [[group for _first_row, group in sorted(spans_of, key=lambda span: span[0])] for spans_of in ranked]


def _by_k(groups: list[list[_Group]]) -> dict[int, list[tuple[int, int]]]:
    """(rollout, group) positions of every group, keyed by k, so each k is one batched field op."""
    positions: dict[int, list[tuple[int, int]]] = {}
    for rollout, rollout_groups in enumerate(groups):
        for position, group in enumerate(rollout_groups):
            positions.setdefault(group.k, []).append((rollout, position))
    return positions


def build_proofs(
    hidden_states: list[torch.Tensor], topk: int = DEFAULT_TOPK, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> list[bytes]:
    """Proof bytes for each completion's final hidden states (tokens, hidden); ProofError if any is impossible.

    Chunks of all completions are interpolated together (one torch op per step for the batch).
    """
    ranked = [_rank(_check_states(states, topk, chunk_size), topk, chunk_size, True) for states in hidden_states]
    words: list[list[torch.Tensor | None]] = [[None] * len(groups) for groups in ranked]
    for positions in _by_k(ranked).values():
        indices = torch.cat([ranked[r][g].indices for r, g in positions])
        codes = torch.cat([ranked[r][g].codes for r, g in positions])
        if bool(((codes & 0x7F80) == 0x7F80).any()):  # bf16 overflow of a finite fp32 value
            raise ProofError("an activation overflows bfloat16; a proof cannot commit to it")
        moduli = injective_moduli(indices)
        coefficients = interpolate(indices % moduli.reshape(-1, 1), codes)
        table = torch.cat([moduli.reshape(-1, 1), coefficients], dim=1)
        sizes = [ranked[r][g].indices.shape[0] for r, g in positions]
        for (r, g), part in zip(positions, torch.split(table, sizes), strict=True):
            words[r][g] = part
    return [
        torch.cat([w.reshape(-1) for w in rollout_words if w is not None])
        .to(torch.int32)
        .numpy()
        .astype(">u2")
        .tobytes()
        for rollout_words in words
    ]


def build_proof(hidden_states: torch.Tensor, topk: int = DEFAULT_TOPK, chunk_size: int = DEFAULT_CHUNK_SIZE) -> bytes:
    """The proof bytes of one completion's final hidden states (tokens, hidden); ProofError if impossible."""
    return build_proofs([hidden_states], topk, chunk_size)[0]


def _parse(
    proof: bytes, groups: list[_Group], num_rows: int, hidden_size: int, topk: int, chunk_size: int
) -> list[torch.Tensor]:
    """The (chunks, 1 + k) words of each group: modulus then coefficients; ProofError when malformed."""
    if not isinstance(proof, bytes | bytearray):
        raise ProofError(f"a proof is bytes, got {type(proof).__name__}")
    expected = proof_size_bytes(num_rows, hidden_size, topk, chunk_size)
    if len(proof) != expected:
        raise ProofError(
            f"proof is {len(proof)} bytes but {num_rows} tokens of hidden size {hidden_size} need {expected}"
            f" (topk {topk}, one chunk per {chunk_size} tokens)"
        )
    words = np.frombuffer(proof, dtype=">u2").astype(np.int64)  # numpy: a tenth of torch's cost per small proof
    tables = []
    offset = 0
    for group in groups:
        num_chunks = group.indices.shape[0]
        table = words[offset : offset + num_chunks * (group.k + 1)].reshape(num_chunks, group.k + 1)
        offset += num_chunks * (group.k + 1)
        moduli = table[:, 0]
        if bool(((moduli < group.k) | (moduli > PRIME)).any()):
            raise ProofError(f"proof has a chunk modulus outside [{group.k}, {PRIME}] (a null or corrupt proof)")
        if bool((table[:, 1:] >= PRIME).any()):
            raise ProofError(f"proof has a coefficient outside the field GF({PRIME})")
        tables.append(torch.from_numpy(table))
    return tables


def check_proofs(
    hidden_states: list[torch.Tensor],
    proofs: list[bytes],
    topk: int = DEFAULT_TOPK,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> list[list[ChunkCheck] | ProofError]:
    """For each completion, per-chunk error measures of its proof against recomputed states,
    or the ProofError saying why the proof (or the states) cannot be checked."""
    if len(hidden_states) != len(proofs):
        raise ValueError(f"{len(hidden_states)} state tensors for {len(proofs)} proofs")
    outcome: list[list[ChunkCheck] | ProofError] = []
    checked: dict[int, torch.Tensor] = {}
    for rollout, states in enumerate(hidden_states):
        try:
            checked[rollout] = _check_states(states, topk, chunk_size)
            outcome.append([])
        except ProofError as exc:
            outcome.append(exc)
    ranked: list[list[_Group]] = [[] for _ in hidden_states]
    for rollout, groups in zip(checked, _rank_many(list(checked.values()), topk, chunk_size, False), strict=True):
        ranked[rollout] = groups
    tables: list[list[torch.Tensor]] = [[] for _ in hidden_states]
    for rollout, states in checked.items():
        try:
            num_rows, hidden_size = states.shape
            tables[rollout] = _parse(proofs[rollout], ranked[rollout], num_rows, hidden_size, topk, chunk_size)
        except ProofError as exc:
            ranked[rollout] = []
            outcome[rollout] = exc
    results: list[list[list[ChunkCheck]]] = [[[] for _ in groups] for groups in ranked]
    for positions in _by_k(ranked).values():
        indices = torch.cat([ranked[r][g].indices for r, g in positions])
        mine = torch.cat([ranked[r][g].codes for r, g in positions])
        table = torch.cat([tables[r][g] for r, g in positions])
        claimed = evaluate(table[:, 1:], indices % table[:, :1])
        checks = _compare(claimed, mine)
        offset = 0
        for r, g in positions:
            num_chunks = ranked[r][g].indices.shape[0]
            results[r][g] = checks[offset : offset + num_chunks]
            offset += num_chunks
    for r, rollout_results in enumerate(results):
        if not isinstance(outcome[r], ProofError):
            outcome[r] = [check for group_checks in rollout_results for check in group_checks]
    return outcome


def check_proof(
    hidden_states: torch.Tensor, proof: bytes, topk: int = DEFAULT_TOPK, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> list[ChunkCheck]:
    """Per-chunk error measures of ``proof`` against recomputed states; ProofError if the proof is malformed."""
    result = check_proofs([hidden_states], [proof], topk, chunk_size)[0]
    if isinstance(result, ProofError):
        raise result
    return result


def _compare(claimed: torch.Tensor, mine: torch.Tensor) -> list[ChunkCheck]:
    """Chunk measures from claimed and recomputed codes, both (chunks, k)."""
    exp_equal = ((claimed >> 7) & 0xFF) == ((mine >> 7) & 0xFF)
    sign_differs = (claimed >> 15) != (mine >> 15)
    mant_err = ((claimed & 0x7F) - (mine & 0x7F)).abs()
    num_matched = exp_equal.sum(dim=-1)
    num_sign_mismatches = (sign_differs & exp_equal).sum(dim=-1)
    sums = torch.where(exp_equal, mant_err, 0).sum(dim=-1)
    ordered = torch.where(exp_equal, mant_err, _NOT_MATCHED).sort(dim=-1).values
    middle = ((num_matched - 1).clamp(min=0) // 2).reshape(-1, 1)
    medians = ordered.gather(1, middle).reshape(-1)
    k = claimed.shape[1]
    return [
        ChunkCheck(
            exp_mismatches=k - matched,
            sign_mismatches=signs,
            mant_err_mean=total / matched if matched else math.inf,
            mant_err_median=float(median) if matched else math.inf,
            mant_err_sum=int(total),
        )
        for matched, signs, total, median in zip(
            num_matched.tolist(), num_sign_mismatches.tolist(), sums.tolist(), medians.tolist(), strict=True
        )
    ]
