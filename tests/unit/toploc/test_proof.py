"""TOPLOC proofs: field arithmetic, the byte layout, the value rule, and checks against recomputed states."""

from __future__ import annotations

import pytest
import torch

from protocol.errors import ProofError
from toploc.field import PRIME, evaluate, injective_moduli, interpolate, inverse_table
from toploc.proof import (
    ChunkCheck,
    build_proof,
    build_proofs,
    check_proof,
    check_proofs,
    proof_size_bytes,
    value_codes,
)

EXACT = ChunkCheck(exp_mismatches=0, sign_mismatches=0, mant_err_mean=0.0, mant_err_median=0.0)


def _states(num_tokens: int, hidden_size: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_tokens, hidden_size, generator=torch.Generator().manual_seed(seed))


def test_inverse_table() -> None:
    table = inverse_table()
    a = torch.arange(1, PRIME)
    assert bool((a * table[1:] % PRIME == 1).all())


@pytest.mark.parametrize("k", [1, 2, 17, 128])
def test_interpolation_passes_through_every_point(k: int) -> None:
    generator = torch.Generator().manual_seed(k)
    xs = torch.stack([torch.randperm(PRIME, generator=generator)[:k] for _ in range(5)])
    ys = torch.randint(0, PRIME, (5, k), generator=generator)
    coefficients = interpolate(xs, ys)
    assert coefficients.shape == (5, k)
    assert bool((coefficients < PRIME).all()) and bool((coefficients >= 0).all())
    assert torch.equal(evaluate(coefficients, xs), ys)
    # Horner in plain Python integers agrees with the tensor evaluation.
    value = 0
    for c in reversed(coefficients[0].tolist()):
        value = (value * int(xs[0, k - 1]) + c) % PRIME
    assert value == int(ys[0, k - 1])


@pytest.mark.parametrize("k", [1, 2, 3, 128, 129])
def test_evaluation_equals_horner_in_python_integers(k: int) -> None:
    """evaluate reduces once per two Horner steps; on any 16-bit words (even >= PRIME) it must agree with Python."""
    generator = torch.Generator().manual_seed(k)
    coefficients = torch.randint(0, 1 << 16, (4, k), generator=generator)
    coefficients[0] = (1 << 16) - 1
    xs = torch.randint(0, 1 << 17, (4, 9), generator=generator)
    expected = []
    for row, points in zip(coefficients.tolist(), xs.tolist(), strict=True):
        values = []
        for x in points:
            value = 0
            for c in reversed(row):
                value = (value * x + c) % PRIME
            values.append(value)
        expected.append(values)
    assert evaluate(coefficients, xs).tolist() == expected


def test_injective_modulus_steps_down_on_collisions() -> None:
    indices = torch.tensor([[5, 5 + PRIME, 9, 100], [1, 2, 3, 4]])
    moduli = injective_moduli(indices)
    assert int(moduli[1]) == PRIME
    assert int(moduli[0]) < PRIME
    reduced = indices[0] % moduli[0]
    assert len(set(reduced.tolist())) == 4


def test_value_codes_are_bf16_patterns_with_sign() -> None:
    values = torch.tensor([1.0, -1.0, 3.0, -0.0, 1.00390625])
    assert value_codes(values).tolist() == [0x3F80, 0xBF80, 0x4040, 0x8000, 0x3F80]  # last one rounds to even
    assert value_codes(values.to(torch.bfloat16)).tolist()[:4] == [0x3F80, 0xBF80, 0x4040, 0x8000]


def test_layout_is_258_bytes_per_chunk_at_k128() -> None:
    states = _states(96)
    proof = build_proof(states)
    assert len(proof) == 3 * 258 == proof_size_bytes(96, 256)
    assert int.from_bytes(proof[:2], "big") <= PRIME
    # A short last chunk commits to at most one entry in 16 of its own (its largest ones).
    assert proof_size_bytes(33, 256) == 258 + (2 + 2 * 16)
    assert proof_size_bytes(33, 64) == 258 + (2 + 2 * 4)
    assert proof_size_bytes(1, 8) == 2 + 2 * 1
    assert len(build_proof(_states(33, 64))) == proof_size_bytes(33, 64)


def test_a_one_row_tail_chunk_survives_honest_recomputation_noise() -> None:
    """Regression: an honest 33-token rollout of a 64-wide model was rejected (mantissa error mean 0.22).

    Its 1-row tail chunk committed to all 64 entries, near-zero ones included, whose bf16 codes
    flip under the ~1e-6 differences of a batched, padded prefill. Only large entries are committed now.
    """
    generator = torch.Generator().manual_seed(91)
    states = torch.randn(33, 64, generator=generator)
    states[32, :48] *= 1e-3  # a row with many near-zero entries, as final-norm states have
    proof = build_proof(states)
    worst = 0.0
    for trial in range(20):
        noise = torch.randn(33, 64, generator=generator) * 2e-6
        checks = check_proof(states + noise, proof)
        worst = max(worst, checks[-1].mant_err_mean)
        assert checks[-1].exp_mismatches == 0 and checks[-1].sign_mismatches == 0, (trial, checks[-1])
    assert worst == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 31, 32, 70])
def test_honest_states_match_exactly(dtype: torch.dtype, num_tokens: int) -> None:
    states = _states(num_tokens, 64).to(dtype)
    checks = check_proof(states, build_proof(states))
    assert checks == [EXACT] * len(range(0, num_tokens, 32))


def test_batched_build_and_check_equal_one_by_one() -> None:
    batch = [_states(n, 64, seed=n) for n in (5, 40, 64, 97)]
    proofs = build_proofs(batch)
    assert proofs == [build_proof(states) for states in batch]
    assert check_proofs(batch, proofs) == [check_proof(s, p) for s, p in zip(batch, proofs, strict=True)]


def test_checks_of_many_rollouts_equal_each_rollout_checked_alone() -> None:
    """check_proofs ranks same-shaped chunks of all rollouts together; every outcome must be the rollout's own,
    on honest, perturbed, tied (many equal magnitudes), mixed-dtype, mixed-width and malformed inputs."""
    generator = torch.Generator().manual_seed(11)
    states, proofs = [], []
    for i, (num_tokens, hidden_size) in enumerate([(1, 64), (5, 64), (31, 64), (32, 64), (33, 96), (64, 64), (97, 96)]):
        committed = _states(num_tokens, hidden_size, seed=i)
        proof = build_proof(committed)
        tied = torch.randint(-3, 4, (num_tokens, hidden_size), generator=generator).to(torch.float32)
        states += [committed, committed + 0.05 * torch.randn(committed.shape, generator=generator), -committed]
        states += [committed.to(torch.bfloat16), tied, 1.3 * committed]
        proofs += [proof, proof, proof, proof, build_proof(tied), proof]
    states += [_states(40, 64), _states(3, 64)]
    proofs += [b"\x00" * proof_size_bytes(40, 64), b"\x01"]
    together = check_proofs(states, proofs)
    alone = [check_proofs([s], [p])[0] for s, p in zip(states, proofs, strict=True)]
    assert [str(r) if isinstance(r, ProofError) else r for r in together] == [
        str(r) if isinstance(r, ProofError) else r for r in alone
    ]
    assert sum(isinstance(r, ProofError) for r in together) == 2
    assert any(r != [EXACT] * len(r) for r in together if not isinstance(r, ProofError))


def test_fp32_noise_below_bf16_precision_is_almost_invisible() -> None:
    states = _states(64)
    recomputed = states * (1 + 1e-6 * torch.randn(states.shape, generator=torch.Generator().manual_seed(1)))
    for check in check_proof(recomputed, build_proof(states)):
        assert check.exp_mismatches <= 1 and check.sign_mismatches == 0
        assert check.mant_err_mean < 0.05 and check.mant_err_median == 0


def test_flipped_signs_are_caught() -> None:
    states = _states(64)
    for check in check_proof(states, build_proof(-states)):
        assert check.exp_mismatches == 0 and check.mant_err_mean == 0
        assert check.sign_mismatches == 128


def test_scaled_states_show_mantissa_error() -> None:
    states = _states(64)
    for check in check_proof(states * 1.02, build_proof(states)):
        assert check.mant_err_mean > 1.0


def test_unrelated_states_mismatch_almost_everywhere() -> None:
    for check in check_proof(_states(64, seed=2), build_proof(_states(64, seed=1))):
        assert check.exp_mismatches > 100


def test_malformed_proofs_raise_proof_error() -> None:
    states = _states(40)
    proof = build_proof(states)
    with pytest.raises(ProofError, match="bytes but"):
        check_proof(states, proof[:-1])
    with pytest.raises(ProofError, match="bytes but"):
        check_proof(states[:20], proof)
    with pytest.raises(ProofError, match="null or corrupt"):
        check_proof(states, bytes(len(proof)))
    with pytest.raises(ProofError, match="outside the field"):
        check_proof(states, proof[:2] + b"\xff\xff" + proof[4:])
    with pytest.raises(ProofError, match="is bytes"):
        check_proof(states, "not bytes")  # type: ignore[arg-type]
    outcomes = check_proofs([states, states], [proof, b"junk"])
    assert isinstance(outcomes[1], ProofError) and not isinstance(outcomes[0], ProofError)


def test_states_that_cannot_be_committed_raise() -> None:
    states = _states(8)
    states[3, 5] = float("nan")
    with pytest.raises(ProofError, match="NaN"):
        build_proof(states)
    with pytest.raises(ProofError, match="overflows"):
        build_proof(torch.full((2, 128), 3.4e38))
    with pytest.raises(ProofError, match="no hidden states"):
        build_proof(torch.zeros(0, 64))
    with pytest.raises(ProofError, match="tokens, hidden"):
        build_proof(torch.zeros(64))
    with pytest.raises(ProofError, match="floating point"):
        build_proof(torch.zeros(4, 64, dtype=torch.int64))


def test_chunk_whose_top_indices_collide_mod_the_prime_round_trips() -> None:
    """Two committed indices 65497 apart force a smaller modulus; build and check must agree exactly."""
    states = _states(32, 2048) * 0.01
    flat = states.view(-1)
    flat[5], flat[5 + PRIME] = 50.0, -60.0
    proof = build_proof(states)
    assert int.from_bytes(proof[:2], "big") < PRIME
    assert check_proof(states, proof) == [EXACT]
