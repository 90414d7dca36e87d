"""`prime-relay`: serve policy weights to workers, or fetch a version by hand."""

from __future__ import annotations

from pathlib import Path

import typer

from protocol.cli import (
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    SetOption,
    load_role_config,
    not_yet_built,
    start_logging,
)
from shardcast.config import RelayConfig

app = typer.Typer(help="SHARDCAST relays: mirror signed policy versions over HTTP.", no_args_is_help=True)


@app.command()
def serve(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    upstream: list[str] | None = typer.Option(None, help="Origin or relay URL to mirror (repeatable)."),
    host: str | None = typer.Option(None, help="Interface to serve on."),
    port: int | None = typer.Option(None, help="Port to serve on."),
    coordinator_id: str | None = typer.Option(None, help="Node id whose manifest signatures are trusted."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Mirror every version the upstreams announce, verifying each shard before serving it."""
    start_logging(log_level, json_logs)
    flags = {"upstreams": upstream or None, "host": host, "port": port, "coordinator_id": coordinator_id}
    load_role_config(RelayConfig, config, sets, flags)
    not_yet_built("the relay server", 4)


@app.command()
def fetch(
    version: int = typer.Argument(..., help="Policy version to download."),
    relay: list[str] = typer.Option(..., help="Relay URL (repeatable; downloads from all at once)."),
    coordinator_id: str = typer.Option(..., help="Node id whose manifest signature is trusted."),
    out: Path = typer.Option(Path("."), help="Directory the version is written under."),
) -> None:
    """Download one version from several relays, verifying every shard."""
    not_yet_built("the SHARDCAST client", 4)
