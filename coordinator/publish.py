"""`prime-coordinator publish`: publish a checkpoint as a policy version from a shell, as the orchestrator does."""

from __future__ import annotations

from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.loop.policies import policy_store, publish_policy, published_version
from coordinator.serving.server import open_ledger
from environments.prompts import NoPrompts
from protocol.identity import load_or_create_identity


def publish_from_cli(config: CoordinatorConfig, checkpoint: Path, version: int | None) -> None:
    """`prime-coordinator publish`: the same publication the orchestrator makes, from a shell."""
    identity = load_or_create_identity(config.data_dir)
    database, ledger = open_ledger(config, NoPrompts(), identity.node_id)
    try:
        current = published_version(ledger)
        chosen = version if version is not None else (0 if current is None else current + 1)
        signed = publish_policy(checkpoint, chosen, identity, policy_store(config), ledger, config)
        print(f"published policy v{signed.manifest.version} from {checkpoint}")
    finally:
        database.dispose()
