"""`prime-validator`: the auditor's command."""

from __future__ import annotations

from pathlib import Path

import typer

from runtime.cli import (
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    NoP2POption,
    PrimeTyper,
    load_role_config,
    make_config_app,
    make_keys_app,
    set_option,
    start_logging,
)
from validator.config import ValidatorConfig

SetOption = set_option("toploc.max_exp_mismatches=6")

app = PrimeTyper(help="Audit submitted rollouts: recompute, check proofs, post verdicts.", no_args_is_help=True)
app.add_typer(make_keys_app(ValidatorConfig, "prime-validator", "data_dir=/srv/validator"), name="keys")
app.add_typer(
    make_config_app("prime-validator", {"run": ValidatorConfig}, "toploc.max_exp_mismatches=6"), name="config"
)


@app.command()
def run(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    coordinator: str | None = typer.Option(None, help="Coordinator URL."),
    data_dir: Path | None = typer.Option(None, help="Node key and downloaded weights."),
    no_p2p: bool = NoP2POption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Validate pending submissions until stopped (Ctrl-C).

    Exit codes: 0 the run ended; 3 the coordinator refuses this validator;
    4 it refused a request; 2 an invalid config; 1 any other error;
    130 Ctrl-C or SIGTERM: stops within seconds, whatever the validator does
    (downloading, auditing); a second Ctrl-C stops it at once.
    """
    start_logging(log_level, json_logs)
    flags = {"coordinator_url": coordinator, "data_dir": data_dir, "p2p.enabled": False if no_p2p else None}
    settings = load_role_config(ValidatorConfig, config, sets, flags)
    from validator.run import run_audit

    raise typer.Exit(run_audit(settings, show_live_status=not json_logs))
