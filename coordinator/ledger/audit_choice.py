"""Which samples of a submission validators must re-check: picked by the ledger, unpredictable to workers.

With ``validation.audit_fraction`` below 1, validators recompute (prefill) only some samples
of each submission. The choice is a keyed shuffle of the submission's rollout positions: each
position is ranked by an HMAC-SHA256 of the run secret, the submission id and the position,
and the lowest ``ceil(fraction * n)`` (at least one) are audited. The submission id is drawn
by the ledger when the submission is stored, so a worker learns which samples are checked
only after it can no longer change any of them; without the run secret it cannot predict
them at all. The ledger (and only it) can recompute the same choice at any time.
"""

from __future__ import annotations

import hashlib
import hmac
import math

_DOMAIN = b"prime-network/audit-samples/v1"


def num_audited(num_samples: int, fraction: float) -> int:
    """How many of ``num_samples`` samples are audited at ``fraction`` (at least one, at most all)."""
    if num_samples <= 0:
        return 0
    return min(num_samples, max(1, math.ceil(fraction * num_samples - 1e-9)))


def audit_sample_indices(run_secret_hex: str, submission_id: str, num_samples: int, fraction: float) -> list[int]:
    """Positions (in the submission's rollout order, ascending) that validators must re-check."""
    if fraction >= 1.0:
        return list(range(num_samples))
    key = bytes.fromhex(run_secret_hex)

    def rank(position: int) -> bytes:
        message = b"\n".join([_DOMAIN, submission_id.encode(), str(position).encode()])
        return hmac.new(key, message, hashlib.sha256).digest()

    chosen = sorted(range(num_samples), key=rank)[: num_audited(num_samples, fraction)]
    return sorted(chosen)


_REAUDIT_DOMAIN = b"prime-network/reaudit/v1"


def reaudit_chosen(run_secret_hex: str, submission_id: str, share: float) -> bool:
    """Whether an accepted submission is audited again later: a keyed coin with probability ``share``, which
    a worker cannot predict without the run secret (and the ledger can recompute at any time)."""
    if share <= 0:
        return False
    digest = hmac.new(bytes.fromhex(run_secret_hex), _REAUDIT_DOMAIN + b"\n" + submission_id.encode(), hashlib.sha256)
    return int.from_bytes(digest.digest()[:8], "big") < share * 2**64
