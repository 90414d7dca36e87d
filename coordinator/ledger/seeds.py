"""Sampling seeds handed out by the ledger, never chosen by a worker.

A seed is an HMAC-SHA256 of the task's name, its group index and the lease id under the run
secret, cut to 63 bits. Without the secret a worker cannot predict the seed of a task it has not
leased, so it cannot pre-generate with a cheap model; with it, the coordinator can recompute
every seed after a restart (the lease row also stores it). The lease id is in it so that each
lease of a task is a fresh draw: rollouts generated for a lease that was abandoned or expired
fail the sampling replay under the re-issued lease, whoever submits them. Per-sample randomness
is then drawn from the counter-based hash of (seed, sample index, position, token id) by the
sampler.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_BYTES = 32
_DOMAIN = b"prime-network/sampling-seed/v2"


def new_run_secret() -> str:
    """A fresh run secret, hex encoded, stored once in the ledger when the run starts."""
    return secrets.token_hex(SECRET_BYTES)


def sampling_seed(run_secret_hex: str, task_name: str, group_index: int, lease_id: str) -> int:
    """The seed of lease ``lease_id`` of the prompt group ``group_index`` of ``task_name`` (0 <= seed < 2**63)."""
    message = b"\n".join([_DOMAIN, task_name.encode(), str(group_index).encode(), lease_id.encode()])
    digest = hmac.new(bytes.fromhex(run_secret_hex), message, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") >> 1
