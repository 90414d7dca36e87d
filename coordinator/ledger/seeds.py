"""Sampling seeds handed out by the ledger, never chosen by a worker.

A seed is an HMAC-SHA256 of the task's name and group index under the run secret, cut to 63
bits. Without the secret a worker cannot predict the seed of a task it has not leased, so it
cannot pre-generate with a cheap model; with it, the coordinator (and a validator shown the
task) can recompute every seed after a restart. Per-sample randomness is then drawn from the
counter-based hash of (seed, sample index, position, token id) by the sampler.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_BYTES = 32
_DOMAIN = b"prime-network/sampling-seed/v1"


def new_run_secret() -> str:
    """A fresh run secret, hex encoded, stored once in the ledger when the run starts."""
    return secrets.token_hex(SECRET_BYTES)


def sampling_seed(run_secret_hex: str, task_name: str, group_index: int) -> int:
    """The seed of the prompt group ``group_index`` of ``task_name`` in this run (0 <= seed < 2**63)."""
    message = b"\n".join([_DOMAIN, task_name.encode(), str(group_index).encode()])
    digest = hmac.new(bytes.fromhex(run_secret_hex), message, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") >> 1
