"""`prime-validator`: the auditor's command."""

from __future__ import annotations

from pathlib import Path

import typer

from protocol.cli import (
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    SetOption,
    load_role_config,
    make_keys_app,
    not_yet_built,
    start_logging,
)
from validator.config import ValidatorConfig

app = typer.Typer(help="Audit submitted rollouts: recompute, check proofs, post verdicts.", no_args_is_help=True)
app.add_typer(make_keys_app(ValidatorConfig.model_fields["data_dir"].default), name="keys")


@app.command()
def run(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    coordinator: str | None = typer.Option(None, help="Coordinator URL."),
    data_dir: Path | None = typer.Option(None, help="Node key and downloaded weights."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Validate pending submissions until stopped (Ctrl-C)."""
    start_logging(log_level, json_logs)
    load_role_config(ValidatorConfig, config, sets, {"coordinator_url": coordinator, "data_dir": data_dir})
    not_yet_built("the validator loop", 8)
