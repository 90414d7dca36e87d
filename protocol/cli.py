"""What every console script shares: config loading from flags, logging flags, exit codes, keys.

Entry points stay thin: they declare their flags with typer, call :func:`load_role_config`
and hand the validated config to one ``run`` function imported lazily, so ``--help`` never
imports torch or vllm.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from protocol.config import ConfigT, load_config, parse_assignment
from protocol.errors import ConfigError, PrimeError
from protocol.logs import setup_logging

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_CONFIG = 2
EXIT_BANNED = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130

err_console = Console(stderr=True)

ConfigOption = typer.Option(None, "--config", "-c", help="TOML config file (see configs/).", exists=False)
SetOption = typer.Option(
    None, "--set", help="Override any config key, e.g. --set api.port=8000 (repeatable; value read as TOML)."
)
LogLevelOption = typer.Option("info", "--log-level", help="debug, info, warning or error.", envvar="PRIME_LOG_LEVEL")
JsonLogsOption = typer.Option(False, "--json-logs", help="One JSON object per log line, for machines.")
NoP2POption = typer.Option(
    False, "--no-p2p", help="Stay off the libp2p gossip network (p2p.enabled=false): learn by polling the ledger only."
)


def fail(message: str, exit_code: int = EXIT_FAILURE) -> NoReturn:
    """Print an error a person can act on and exit with ``exit_code``."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)  # brackets are the message's
    raise typer.Exit(exit_code)


def load_role_config(
    cls: type[ConfigT],
    config_path: Path | None,
    sets: list[str] | None,
    flags: Mapping[str, Any] | None = None,
) -> ConfigT:
    """Load a config with ``--set`` assignments and named flags applied (flags win)."""
    try:
        overrides: dict[str, Any] = dict(parse_assignment(item) for item in sets or [])
        overrides.update({key: value for key, value in (flags or {}).items() if value is not None})
        return load_config(cls, config_path, overrides)
    except ConfigError as exc:
        fail(exc.message, EXIT_BAD_CONFIG)


def start_logging(log_level: str, json_logs: bool) -> None:
    try:
        setup_logging(log_level, json_logs)
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_CONFIG)


def run_or_exit(label: str, func: Any, *args: Any) -> None:
    """Call a role's run function, mapping known errors and Ctrl-C to clear exits."""
    try:
        func(*args)
    except KeyboardInterrupt:
        logging.getLogger(label).info("interrupted; stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except PrimeError as exc:
        fail(f"{label}: {exc.message}")


def make_keys_app(default_data_dir: Path) -> typer.Typer:
    """``<cmd> keys show``: create (on first use) and print the node's identity."""
    keys_app = typer.Typer(help="The node's Ed25519 identity (node id = libp2p peer id).", no_args_is_help=True)

    @keys_app.command("show")
    def show(
        data_dir: Path = typer.Option(default_data_dir, "--data-dir", help="Where the node key lives."),
    ) -> None:
        """Print the node id and key file, creating the key (0600) on first use."""
        from protocol.identity import key_path, load_or_create_identity

        try:
            identity = load_or_create_identity(data_dir)
        except PrimeError as exc:
            fail(exc.message)
        typer.echo(f"node id:  {identity.node_id}")
        typer.echo(f"key file: {key_path(data_dir)}")

    return keys_app


def not_yet_built(what: str, issue: int) -> NoReturn:
    """Say plainly that a command exists but its capability has not landed yet."""
    fail(f"{what} is not built yet (issue {issue}); see README.md for what runs today")
