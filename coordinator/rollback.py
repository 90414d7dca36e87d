"""`prime-coordinator rollback --to vN`: ask a run for a rollback to an earlier version, live or stopped."""

from __future__ import annotations

from coordinator.config import CoordinatorConfig
from coordinator.ledger.train_steps import RollbackRequest
from coordinator.loop.canary import keep_for_rollback, rollback_source
from coordinator.loop.policies import policy_store
from coordinator.serving.server import open_ledger
from environments.prompts import NoPrompts
from protocol.errors import ConfigError
from protocol.identity import key_path, load_identity


def rollback_from_cli(config: CoordinatorConfig, version: int, reason: str, lr_scale: float, pause: bool) -> None:
    """Keep version ``version``'s weights for the rollback and ask the run's ledger for it; the RL loop does it
    before its next step (at once on a live run, else when the run starts again)."""
    if not key_path(config.data_dir).is_file():
        raise ConfigError(f"no run in {config.data_dir}: pass the run's config (-c) or --data-dir")
    identity = load_identity(key_path(config.data_dir))
    source = keep_for_rollback(config, version, rollback_source(config, policy_store(config), version))
    database, ledger = open_ledger(config, NoPrompts(), identity.node_id)
    try:
        ledger.train_steps.request_rollback(RollbackRequest(version, reason, lr_scale, pause, str(source)))
    finally:
        database.dispose()
    print(
        f"rollback to v{version} asked for on run {config.run_name!r}: the RL loop publishes its weights again as the "
        "next version before its next step (now if the run is live, else when it starts again)"
    )
