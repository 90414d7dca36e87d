"""How much of a submission validators recompute, from its worker's record, and what that lets cheating reach.

:func:`audit_share` is the run's :class:`~protocol.schemas.AuditPolicy` applied to a worker's record
for the (engine, software version) it submits with: the count of its submissions accepted in a row
since its last rejection. Adaptive audit recomputes every sample until ``full_audit_results``
accepted in a row, then ``1 / results`` of them, never less than the floor (the trusted floor for the
operator's own nodes, which skip the ramp); a rejection starts the record over. The ledger fixes a
submission's share when it stores it; :mod:`coordinator.ledger.audit_choice` then picks which samples
(at least one) from the run secret.

:func:`cheat_bound` is what that policy lets through, in expectation, against the best a cheater can
do: build the record, cheat c of the n samples of each submission at the floor until caught, then
rebuild. With k samples of n recomputed at the floor and proofs that catch a recomputed cheated
sample with probability d (the detection power), a cheating submission is caught with probability
``P = d (1 - C(n - c, k) / C(n, k))``; ``(1 - P) / P`` cheating submissions are accepted before the
catch, which rejects its submission, starts the record over (every sample recomputed again,
``ramp_submissions`` honest submissions before the floor is back) and counts toward the worker's
ban. A re-audit (``reaudit_share`` of the accepted submissions, their other samples) catches a
cheating submission the first audit missed with probability ``reaudit_share * d``, after it was
accepted. The largest share of such a worker's trained samples that are cheated, over c, is
:attr:`CheatBound.cheated_fraction` (c = 1 is the worst when one sample is recomputed); honest
workers' samples only lower the run's share. The inspection game's condition for cheating not to
pay, ``p >= g / (d (g + F))`` with the gain g of one cheated sample (its compute, 1) and the loss F
of a catch (the honest samples that rebuild the record), is :attr:`CheatBound.deterrent_share`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.config import ValidationConfig
from coordinator.ledger.audit_choice import num_audited
from protocol.schemas import AuditPolicy, DashboardAudit, Precision


def audit_policy(validation: ValidationConfig) -> AuditPolicy:
    """The run's audit policy (``[validation]``), as the run spec signs it."""
    adaptive = validation.adaptive
    return AuditPolicy(
        adaptive=adaptive.enabled,
        fixed_share=validation.audit_fraction,
        full_audit_results=adaptive.full_audit_results,
        floor=adaptive.floor,
        trusted_floor=adaptive.trusted_floor,
        trusted_nodes=sorted(set(adaptive.trusted_nodes)),
        reaudit_share=adaptive.reaudit_share if adaptive.enabled else 0.0,
    )


def audit_share(policy: AuditPolicy, accepted_in_a_row: int, trusted: bool = False) -> float:
    """The share of a submission's samples to recompute for a worker with this record."""
    if not policy.adaptive:
        return policy.fixed_share
    if trusted:
        return policy.trusted_floor
    if accepted_in_a_row < policy.full_audit_results:
        return 1.0
    return max(policy.floor, 1.0 / accepted_in_a_row)


def ramp_submissions(policy: AuditPolicy) -> int:
    """Accepted submissions in a row a worker needs (from none) before its share is the floor."""
    if not policy.adaptive:
        return 0
    return max(policy.full_audit_results, math.ceil(1.0 / policy.floor - 1e-9))


@dataclass(frozen=True)
class CheatBound:
    samples_per_submission: int
    audited_at_floor: int
    """Samples of a submission recomputed at the floor (at least one)."""
    detection_power: float
    cheated_per_submission: int
    """c: the cheated samples per submission that get the most cheated samples trained."""
    catch_probability: float
    """P: the chance that a submission with c cheated samples is caught at the floor."""
    cheated_before_catch: float
    """Expected cheated samples accepted up to a catch (a re-audit's catch is of an accepted submission)."""
    honest_after_catch: int
    """Honest samples a caught worker submits to get back to the floor."""
    cheated_fraction: float
    """The largest expected share of a cheating worker's trained samples that are cheated."""
    deterrent_share: float
    """The inspection game's audit share above which cheating a sample costs more than it gains."""


def _catch_probability(n: int, k: int, c: int, detection_power: float) -> float:
    """At least one of c cheated samples among the k of n recomputed, times the detection power."""
    return detection_power * (1.0 - math.comb(n - c, k) / math.comb(n, k))


def cheat_bound(policy: AuditPolicy, samples_per_submission: int, detection_power: float) -> CheatBound:
    """The bound for submissions of ``samples_per_submission`` samples, proofs that catch a recomputed cheated
    sample with probability ``detection_power`` (see the module docstring)."""
    if samples_per_submission < 1 or not 0 < detection_power <= 1:
        raise ValueError("a bound needs at least one sample per submission and a detection power in (0, 1]")
    n = samples_per_submission
    k = num_audited(n, policy.floor if policy.adaptive else policy.fixed_share)
    ramp = ramp_submissions(policy) * n

    def cheated_share(c: int) -> tuple[float, float, float]:
        at_once = _catch_probability(n, k, c, detection_power)
        # A re-audit recomputes the samples the first audit left, after acceptance: it catches, but the caught
        # submission may have trained already, so it counts among the accepted ones.
        later = policy.reaudit_share * detection_power if k < n else 0.0
        caught = at_once + (1.0 - at_once) * later
        accepted = (1.0 - at_once) / caught  # cheating submissions accepted up to the catch
        trained = n * accepted + ramp
        return (c * accepted / trained if trained > 0 else 0.0), caught, c * accepted

    worst = max(range(1, n + 1), key=lambda c: cheated_share(c)[0])
    fraction, caught, before = cheated_share(worst)
    return CheatBound(
        samples_per_submission=n,
        audited_at_floor=k,
        detection_power=detection_power,
        cheated_per_submission=worst,
        catch_probability=caught,
        cheated_before_catch=before,
        honest_after_catch=ramp,
        cheated_fraction=fraction,
        deterrent_share=min(1.0, 1.0 / (detection_power * (1.0 + ramp))),
    )


def audit_summary(policy: AuditPolicy, precision: Precision, samples_per_submission: int) -> DashboardAudit:
    """The policy and its bound, with the detection power measured by the run precision's TOPLOC calibrations."""
    from toploc.calibrations import detection_power

    measured = detection_power(precision)
    bound = cheat_bound(policy, samples_per_submission, measured.power)
    return DashboardAudit(
        adaptive=policy.adaptive,
        lowest_share=policy.floor if policy.adaptive else policy.fixed_share,
        full_audit_results=policy.full_audit_results,
        samples_per_submission=samples_per_submission,
        detection_power=measured.power,
        detection_trials=measured.trials,
        cheated_fraction_bound=bound.cheated_fraction,
        deterrent_share=bound.deterrent_share,
    )
