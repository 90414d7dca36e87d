"""What every long-running node (worker, validator) settles at start: its version, the coordinator it trusts,
and the end-of-sequence ids of the policy it serves or checks."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from node.retry import with_retries
from protocol.errors import IdentityError
from protocol.identity import public_key_from_node_id
from protocol.ledger_client import LedgerClient

PINNED_COORDINATOR_FILE = "coordinator_id"


def software_version() -> str:
    try:
        return version("prime-network")
    except PackageNotFoundError:
        return "dev"


def pin_coordinator_id(data_dir: Path, learned: str) -> str:
    """Trust on first use: remember the coordinator id, and refuse a different one later."""
    public_key_from_node_id(learned)  # raises IdentityError for junk
    path = data_dir / PINNED_COORDINATOR_FILE
    if path.exists():
        pinned = path.read_text().strip()
        if pinned != learned:
            raise IdentityError(
                f"the coordinator now signs as {learned}, but {path} pins {pinned}; if the operator really "
                "changed keys, delete that file (or pass --set coordinator_id=...)"
            )
        return pinned
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(learned + "\n")
    return learned


async def trusted_coordinator_id(
    ledger: LedgerClient, data_dir: Path, configured: str | None, stop: asyncio.Event
) -> str:
    """The coordinator id to trust: the configured one, else the signer of its latest manifest; pinned."""
    if configured is None:
        configured = (await with_retries("coordinator identity", ledger.manifest, stop)).signer
    return pin_coordinator_id(data_dir, configured)


def eos_token_ids(checkpoint_dir: Path) -> tuple[int, ...]:
    """The EOS ids of a checkpoint, from its generation or model config."""
    for name in ("generation_config.json", "config.json"):
        path = checkpoint_dir / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, int):
                return (value,)
            if isinstance(value, list) and value:
                return tuple(int(item) for item in value)
    return ()
