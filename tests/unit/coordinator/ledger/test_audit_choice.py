"""The ledger's choice of audited samples: deterministic for the ledger, covers the fraction, differs per submission."""

from __future__ import annotations

from collections import Counter

import pytest

from coordinator.ledger.audit_choice import audit_sample_indices, num_audited
from coordinator.ledger.seeds import new_run_secret


def test_the_same_submission_gets_the_same_samples() -> None:
    secret = new_run_secret()
    first = audit_sample_indices(secret, "s-abc", 64, 0.25)
    assert first == audit_sample_indices(secret, "s-abc", 64, 0.25)
    assert first == sorted(set(first)) and all(0 <= i < 64 for i in first)


@pytest.mark.parametrize(
    ("num_samples", "fraction", "expected"), [(64, 0.25, 16), (10, 0.01, 1), (7, 0.5, 4), (3, 1.0, 3)]
)
def test_the_fraction_is_covered_and_at_least_one_sample_is_audited(
    num_samples: int, fraction: float, expected: int
) -> None:
    assert num_audited(num_samples, fraction) == expected
    assert len(audit_sample_indices(new_run_secret(), "s-1", num_samples, fraction)) == expected


def test_full_fraction_audits_every_sample() -> None:
    assert audit_sample_indices(new_run_secret(), "s-1", 5, 1.0) == [0, 1, 2, 3, 4]


def test_choices_differ_across_submissions_and_runs() -> None:
    secret = new_run_secret()
    by_submission = {tuple(audit_sample_indices(secret, f"s-{i}", 64, 0.125)) for i in range(50)}
    assert len(by_submission) > 45  # 8 of 64: about 4e9 possible choices
    by_run = {tuple(audit_sample_indices(new_run_secret(), "s-same", 64, 0.125)) for _ in range(50)}
    assert len(by_run) > 45
    # Every position is audited about as often as any other: no sample a worker could safely cheat on.
    counts = Counter(i for n in range(400) for i in audit_sample_indices(secret, f"s-{n}", 64, 0.125))
    assert set(counts) == set(range(64))  # each one missed with probability (7/8)**400
    assert min(counts.values()) >= 20 and max(counts.values()) <= 90  # about 50 each
