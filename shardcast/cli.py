"""`prime-relay`: serve policy weights to workers, fetch a version by hand, or run a standalone origin."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from protocol.errors import PrimeError
from runtime.cli import (
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    NoP2POption,
    PrimeTyper,
    fail,
    load_role_config,
    make_config_app,
    run_or_exit,
    set_option,
    start_logging,
)
from shardcast.relay.config import RelayConfig

SetOption = set_option("port=8101")

app = PrimeTyper(help="SHARDCAST relays: mirror signed policy versions over HTTP.", no_args_is_help=True)
app.add_typer(make_config_app("prime-relay", {"serve": RelayConfig}, "port=8101"), name="config")


@app.command()
def serve(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    upstream: list[str] | None = typer.Option(None, help="Origin or relay URL to mirror (repeatable)."),
    host: str | None = typer.Option(None, help="Interface to serve on."),
    port: int | None = typer.Option(None, help="Port to serve on."),
    coordinator_id: str | None = typer.Option(None, help="Node id whose manifest signatures are trusted."),
    data_dir: Path | None = typer.Option(None, help="Where mirrored versions are kept."),
    no_p2p: bool = NoP2POption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Mirror every version the upstreams announce, verifying each shard before serving it."""
    start_logging(log_level, json_logs)
    flags = {
        "upstreams": upstream or None,
        "host": host,
        "port": port,
        "coordinator_id": coordinator_id,
        "data_dir": data_dir,
        "p2p.enabled": False if no_p2p else None,
    }
    relay_config = load_role_config(RelayConfig, config, sets, flags)
    from shardcast.relay.service import run_relay

    run_or_exit("relay", run_relay, relay_config)


@app.command()
def fetch(
    version: str = typer.Argument(..., help="Policy version to download, or 'latest'."),
    relay: list[str] = typer.Option(..., help="Relay URL (repeatable; downloads from all at once)."),
    coordinator_id: str = typer.Option(..., help="Node id whose manifest signature is trusted."),
    out: Path = typer.Option(Path("."), help="Directory the version is written under (as v{N}/)."),
    parallel: int = typer.Option(8, min=1, max=256, help="Shards downloaded at the same time."),
    max_attempts: int = typer.Option(6, min=1, max=100, help="Failed fetches of one shard before giving up."),
    json_events: bool = typer.Option(False, "--json-events", help="One JSON object per line on stdout, for programs."),
    no_fsync: bool = typer.Option(False, "--no-fsync", help="Skip syncing files to disk before exposing the version."),
    min_rate: float = typer.Option(
        32 * 1024, "--min-rate-bps", min=0, help="Slowest body rate accepted from a relay (bytes/s; 0: no floor)."
    ),
    hedge_after: float = typer.Option(
        1.5, "--hedge-after-s", min=0.01, help="Also ask another relay for a request still running after this long."
    ),
    run_name: str | None = typer.Option(
        None, "--run-name", help="Use only manifests the coordinator signed for this run (its run_name)."
    ),
    not_ready_timeout: float = typer.Option(
        120.0,
        "--not-ready-timeout-s",
        min=0.01,
        help="Give up when no shard verified for this long while the relays answer only 503 (not mirrored yet).",
    ),
    log_level: str = LogLevelOption,
) -> None:
    """Download one version from several relays, verifying every shard; resumes an interrupted download."""
    start_logging(log_level, json_logs=False)
    number = None if version == "latest" else _parse_version(version)
    transfer = {
        "num_parallel": parallel,
        "max_attempts_per_shard": max_attempts,
        "fsync_enabled": not no_fsync,
        "min_rate_bps": min_rate,
        "hedge_after_s": hedge_after,
        "not_ready_timeout_s": not_ready_timeout,
    }
    from shardcast.client.fetch import fetch_from_cli

    fetch_from_cli(number, relay, coordinator_id, out, transfer, json_events, run_name)


@app.command()
def publish(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (safetensors, config, tokenizer...)."),
    version: int = typer.Option(..., min=0, help="Policy version number to publish it as."),
    store: Path = typer.Option(..., help="The origin's store directory (what `prime-relay origin` serves)."),
    key_dir: Path = typer.Option(..., help="Directory holding the coordinator's node_key.pem (created if absent)."),
    shard_size_bytes: int = typer.Option(32 * 1024 * 1024, min=4096, help="Shard size in bytes."),
    hash_algorithm: str = typer.Option("blake3", help="blake3 or sha256."),
    keep_versions: int = typer.Option(3, min=1, help="Versions kept (at least async_level + 1)."),
    no_fsync: bool = typer.Option(False, "--no-fsync", help="Skip syncing the files to disk (faster, not crash-safe)."),
    copy: bool = typer.Option(
        False, "--copy", help="Copy the files into the store instead of hard-linking them (if they may be rewritten)."
    ),
    no_patches: bool = typer.Option(
        False, "--no-patches", help="Always publish the full checkpoint, never a value patch against the last version."
    ),
    full_every: int = typer.Option(10, min=1, help="Versions that are a multiple of this are always published full."),
    run_name: str | None = typer.Option(
        None, "--run-name", help="Sign the version as this run's (nodes of another run refuse it)."
    ),
    log_level: str = LogLevelOption,
) -> None:
    """Hash, sign and atomically publish a checkpoint as a new version (what the coordinator does).

    The version is a value patch against the version announced before it when that one is still
    in the store, the version is not a multiple of --full-every, and the patch is smaller.

    The files enter the store as hard links when they can (no copy): never rewrite a published
    checkpoint in place, or pass --copy.
    """
    start_logging(log_level, json_logs=False)
    if hash_algorithm not in ("blake3", "sha256"):
        fail(f"--hash-algorithm must be blake3 or sha256, not {hash_algorithm!r}", 2)
    from shardcast.origin.standalone import publish_from_cli

    try:
        summary = publish_from_cli(
            checkpoint,
            version,
            store,
            key_dir,
            shard_size_bytes=shard_size_bytes,
            hash_algorithm="sha256" if hash_algorithm == "sha256" else "blake3",
            keep_versions=keep_versions,
            fsync_enabled=not no_fsync,
            link_enabled=not copy,
            patches_enabled=not no_patches,
            full_every=full_every,
            run_name=run_name,
        )
    except PrimeError as exc:
        fail(f"publish: {exc.message}")
    typer.echo(json.dumps(summary))


@app.command()
def origin(
    store: Path = typer.Option(..., help="Store directory written by `prime-relay publish`."),
    host: str = typer.Option("127.0.0.1", help="Interface to serve on."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to serve on."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Serve a published store as a SHARDCAST origin (the coordinator mounts the same app at /shardcast)."""
    start_logging(log_level, json_logs)
    from shardcast.origin.standalone import serve_origin

    run_or_exit("origin", serve_origin, store, host, port)


def _parse_version(text: str) -> int:
    if not text.isdigit():
        fail(f"VERSION must be a non-negative integer or 'latest', not {text!r}", 2)
    return int(text)
