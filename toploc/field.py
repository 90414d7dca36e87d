"""Polynomials over the prime field GF(65497), vectorised over many independent chunks.

A TOPLOC chunk commits to k points (x_i, y_i): x_i is the flat index of a top-k activation
reduced by a per-chunk modulus m <= 65497 chosen so the reduced indices stay distinct, and y_i
is a 16-bit code of the value. The unique polynomial of degree < k through the points is sent
as k coefficients, each < 65497 so it fits in 16 bits. Everything here works on int64 tensors
of shape (chunks, k) with every product below 2^63 (operands < 2^16), so one torch op handles
all chunks of a rollout, or of many rollouts, at once: interpolation is Newton's divided
differences (k steps) expanded to monomial form (k steps), evaluation is Horner (k steps).
"""

from __future__ import annotations

from functools import cache

import torch

PRIME = 65497
"""The largest prime below 2^16: coefficients and moduli fit in two bytes."""


@cache
def inverse_table() -> torch.Tensor:
    """``table[a]`` = a^-1 mod PRIME for a in [1, PRIME), table[0] = 0; by Fermat, a^(p-2)."""
    base = torch.arange(PRIME, dtype=torch.int64)
    result = torch.ones_like(base)
    exponent = PRIME - 2
    while exponent:
        if exponent & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        exponent >>= 1
    result[0] = 0
    return result


def _has_duplicates(rows: torch.Tensor) -> torch.Tensor:
    """(chunks,) bool: whether a row of (chunks, k) holds some value twice."""
    ordered = rows.sort(dim=-1).values
    return (ordered[:, 1:] == ordered[:, :-1]).any(dim=-1)


def injective_moduli(indices: torch.Tensor) -> torch.Tensor:
    """For each row of ``indices`` (chunks, k) the largest m <= PRIME whose residues stay distinct.

    Indices below PRIME are already distinct residues, so most rows stop at PRIME at once; rows
    that collide step down one modulus at a time (a handful of steps in practice).
    """
    moduli = torch.full((indices.shape[0],), PRIME, dtype=torch.int64)
    pending = torch.arange(indices.shape[0])
    k = indices.shape[1]
    while pending.numel():
        colliding = _has_duplicates(indices[pending] % moduli[pending].reshape(-1, 1))
        pending = pending[colliding]
        moduli[pending] -= 1
        if pending.numel() and int(moduli[pending].min()) < k:
            raise ValueError("no injective modulus: the indices repeat")
    return moduli


@cache
def _doubled_inverse_table() -> torch.Tensor:
    """``table[a]`` = (a mod PRIME)^-1 for a in [0, 2 * PRIME): looks up a gap plus PRIME without a mod."""
    return inverse_table().repeat(2)


@cache
def _newton_pairs(k: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Index pairs (j, j + step) for step = 1..k-1, step by step, and where each step starts."""
    lower = torch.cat([torch.arange(k - step) for step in range(1, k)]) if k > 1 else torch.zeros(0, dtype=torch.int64)
    upper = lower + torch.cat([torch.full((k - step,), step) for step in range(1, k)]) if k > 1 else lower
    offsets = [0]
    for step in range(1, k):
        offsets.append(offsets[-1] + k - step)
    return lower, upper, tuple(offsets)


def interpolate(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Coefficients (constant first) of the polynomials through (xs, ys), rows being chunks.

    ``xs`` must hold distinct values in [0, PRIME) per row; ``ys`` values in [0, PRIME).
    """
    xs = xs.to(torch.int64)
    divided = ys.to(torch.int64) % PRIME
    num_chunks, k = xs.shape
    lower, upper, offsets = _newton_pairs(k)
    # Every divisor 1 / (x_{j+step} - x_j) of Newton's scheme in one lookup: many small lookups
    # are slow on a busy CPU (each is a parallel region), one large index_select is not.
    gaps = xs.index_select(1, upper) - xs.index_select(1, lower) + PRIME
    inverse_gaps = _doubled_inverse_table().index_select(0, gaps.reshape(-1)).reshape(num_chunks, -1)
    for step in range(1, k):
        numerator = divided[:, step:] - divided[:, step - 1 : k - 1] + PRIME
        divided[:, step:] = numerator * inverse_gaps[:, offsets[step - 1] : offsets[step]] % PRIME
    # Expand the Newton form from the innermost term out: P <- P * (X - x_i) + d_i.
    # After the step for x_i the polynomial has degree k - 1 - i: only that many + 1 columns are live.
    negated_xs = PRIME - xs
    coefficients = torch.zeros_like(divided)
    coefficients[:, 0] = divided[:, k - 1]
    for i in range(k - 2, -1, -1):
        live = k - i
        expanded = coefficients[:, :live] * negated_xs[:, i : i + 1]
        expanded[:, 1:] += coefficients[:, : live - 1]
        expanded[:, 0] += divided[:, i]
        coefficients[:, :live] = expanded % PRIME
    return coefficients


def evaluate(coefficients: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Values in [0, PRIME) of each row's polynomial at that row's points (chunks, num_points).

    Horner's rule, two steps per reduction: with v, x, c < PRIME < 2^16, ``(v * x + c) * x + c'``
    stays below 2^49, so the slow integer remainder runs half as often for the same values.
    """
    xs = xs.to(torch.int64) % PRIME
    coefficients = coefficients.to(torch.int64) % PRIME
    values = coefficients[:, -1:].expand(-1, xs.shape[1]).clone()
    i = coefficients.shape[1] - 2
    while i >= 1:
        values.mul_(xs).add_(coefficients[:, i : i + 1]).mul_(xs).add_(coefficients[:, i - 1 : i]).remainder_(PRIME)
        i -= 2
    if i == 0:
        values.mul_(xs).add_(coefficients[:, :1]).remainder_(PRIME)
    return values
