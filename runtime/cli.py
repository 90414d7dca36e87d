"""What every console script shares: config loading from flags, logging flags, exit codes, keys, errors.

Entry points stay thin: they declare their flags with typer, call :func:`load_role_config`
and hand the validated config to one ``run`` function imported lazily, so ``--help`` never
imports torch or vllm. Every app is a :class:`PrimeTyper`: whatever a command raises ends in
one line on stderr naming the problem and, for the errors prime-network raises on purpose
(:class:`~protocol.errors.PrimeError`, :class:`~protocol.errors.StartupError` with its fix),
what to do, and a non-zero exit; the traceback is printed only with ``--log-level debug``.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from protocol.errors import ConfigError, PrimeError, RunPausedError
from runtime.config import ConfigT, RoleConfig, config_to_toml, load_config, parse_assignment
from runtime.logs import fatal_json_line, json_logs_enabled, printable, setup_logging

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_CONFIG = 2
EXIT_BANNED = 3
EXIT_REFUSED = 4
EXIT_PAUSED = 5
EXIT_INTERRUPTED = 130

err_console = Console(stderr=True)

ConfigOption = typer.Option(None, "--config", "-c", help="TOML config file (see configs/).", exists=False)


def set_option(example: str) -> Any:
    """The ``--set`` option, its help showing ``example``: a key of the command's own config."""
    return typer.Option(
        None, "--set", help=f"Override any config key, e.g. --set {example} (repeatable; value read as TOML)."
    )


LogLevelOption = typer.Option("info", "--log-level", help="debug, info, warning or error.", envvar="PRIME_LOG_LEVEL")
JsonLogsOption = typer.Option(False, "--json-logs", help="One JSON object per log line, for machines.")
NoP2POption = typer.Option(
    False, "--no-p2p", help="Stay off the libp2p gossip network (p2p.enabled=false): learn by polling the ledger only."
)


def one_line(message: str) -> str:
    """``message`` on one line: inner line breaks become "; "."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


def fail(message: str, exit_code: int = EXIT_FAILURE) -> NoReturn:
    """Print an error a person can act on, on one line, and exit with ``exit_code``."""
    if json_logs_enabled():  # a machine reads stderr: the last line is one JSON object like every other
        sys.stderr.write(fatal_json_line(one_line(message), exit_code) + "\n")
        sys.stderr.flush()
        raise typer.Exit(exit_code)
    # escaped: brackets are the message's own ("set [environment]"), not rich markup
    err_console.print(f"[bold red]error:[/] {escape(printable(one_line(message)))}", highlight=False, soft_wrap=True)
    raise typer.Exit(exit_code)


def exit_code_for(exc: PrimeError) -> int:
    if isinstance(exc, RunPausedError):
        return EXIT_PAUSED
    return EXIT_BAD_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILURE


def describe_unexpected(exc: BaseException) -> str:
    """The one line for an error nobody anticipated: what it was, and how to see more."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (
            f"the Python package {exc.name!r} is not installed; install it (pip install {exc.name.split('.')[0]}) "
            "or the extra of prime-network that needs it"
        )
    detail = one_line(str(exc)) or "no details"
    return (
        f"unexpected {type(exc).__name__}: {detail[:400]}; run again with --log-level debug for the traceback, "
        "and report it if the cause is not yours"
    )


def debug_enabled() -> bool:
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def exit_on_error(exc: BaseException, label: str | None = None) -> NoReturn:
    """Turn any failure of a command into its one line and exit code (the traceback at debug level only)."""
    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    prefix = f"{label}: " if label else ""
    if isinstance(exc, PrimeError):
        fail(prefix + exc.message, exit_code_for(exc))
    fail(prefix + describe_unexpected(exc), EXIT_FAILURE)


class PrimeTyper(typer.Typer):
    """The console scripts' app: any error a command raises ends in one line and a non-zero exit.

    Typer's own handling prints a long rich traceback instead; this keeps that for ``--log-level
    debug`` only. ``--help``, usage errors (exit 2) and :func:`fail` behave as before.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("no_args_is_help", True)
        super().__init__(**kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except (SystemExit, typer.Exit):
            raise
        except KeyboardInterrupt:
            err_console.print("interrupted; stopped", highlight=False)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            try:
                exit_on_error(exc)
            except typer.Exit as done:
                sys.exit(done.exit_code)


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
        exit_on_error(exc, label)


def make_keys_app(config_cls: type[RoleConfig], script: str, example: str) -> typer.Typer:
    """``<cmd> keys show`` and ``keys create``: the node's identity, found where the role's config puts it.

    The data dir comes from ``--data-dir``, else from the config (``-c``, environment, ``--set``), so
    ``keys show -c run.toml`` names the same key the command started with ``-c run.toml`` uses. ``show``
    never creates a key: a wrong directory would otherwise print a fresh, meaningless id.
    """
    keys_app = PrimeTyper(help="The node's Ed25519 identity (node id = libp2p peer id).")
    set_keys = set_option(example)
    data_dir_option = typer.Option(
        None, "--data-dir", help="Where the node key lives (default: the config's data_dir)."
    )

    def resolve(data_dir: Path | None, config: Path | None, sets: list[str] | None) -> Path:
        if data_dir is not None:
            return data_dir
        resolved: Path = load_role_config(config_cls, config, sets).data_dir  # type: ignore[attr-defined]
        return resolved

    @keys_app.command("show")
    def show(
        data_dir: Path | None = data_dir_option,
        config: Path | None = ConfigOption,
        sets: list[str] | None = set_keys,
        id_only: bool = typer.Option(False, "--id-only", help="Print the node id alone (for scripts)."),
    ) -> None:
        """Print the node id and key file of an existing key (exit 1 when there is none)."""
        directory = resolve(data_dir, config, sets)
        from runtime.keys import show_key

        try:
            show_key(directory, script, id_only)
        except PrimeError as exc:
            fail(exc.message)

    @keys_app.command("create")
    def create(
        data_dir: Path | None = data_dir_option,
        config: Path | None = ConfigOption,
        sets: list[str] | None = set_keys,
    ) -> None:
        """Create the node key (0600) if there is none, and print the node id and key file."""
        directory = resolve(data_dir, config, sets)
        from runtime.keys import create_key

        try:
            create_key(directory)
        except PrimeError as exc:
            fail(exc.message)

    return keys_app


CONFIG_SHOW_HELP = (
    "Print the config {what} would run with, resolved, as TOML; nothing is started.\n\n"
    "Each key shows the value it ends up with: its default, overridden by the file given with -c, then by "
    "{prefix}* environment variables (nested keys joined by two underscores), then by --set KEY=VALUE. "
    "The other commands' named flags are keys too: set them here with --set (for example --set {example}).\n\n"
    "Unset keys appear as comments, passwords in URLs as ***. A bad key or value gives the same one-line error, "
    "with exit code 2, as the other commands.\n\n"
    "Saved to a file, the output is a config file that reproduces the run: {show} -c run.toml > resolved.toml"
)


def make_config_app(script: str, configs: Mapping[str, type[RoleConfig]], example: str) -> typer.Typer:
    """``<cmd> config show``: the resolved config as TOML. ``configs`` maps the commands that read a config to
    its class; with several (the trainer's sft, rl, eval), ``show`` takes the command's name first."""
    config_app = PrimeTyper(help="Inspect the config the commands would run with.")
    set_config = set_option(example)
    classes = list(configs.values())
    prefix = str(classes[0].model_config.get("env_prefix", ""))

    def show_config(cls: type[RoleConfig], config: Path | None, sets: list[str] | None) -> None:
        loaded = load_role_config(cls, config, sets)
        source = str(config) if config is not None else "defaults only (no -c file)"
        typer.echo(f"# {cls.__name__} resolved from {source}, {prefix}* environment and --set")
        typer.echo(config_to_toml(loaded), nl=False)

    if len(configs) == 1:
        (command_name,) = configs

        def show_one(config: Path | None = ConfigOption, sets: list[str] | None = set_config) -> None:
            show_config(classes[0], config, sets)

        show_one.__doc__ = CONFIG_SHOW_HELP.format(
            what=f"`{script} {command_name}`", prefix=prefix, example=example, show=f"{script} config show"
        )
        config_app.command("show")(show_one)
        return config_app

    names = ", ".join(configs)

    def show_of(
        command: str = typer.Argument(..., metavar="COMMAND", help=f"The command whose config to show: {names}."),
        config: Path | None = ConfigOption,
        sets: list[str] | None = set_config,
    ) -> None:
        if command not in configs:
            fail(f"no command {command!r} reads a config; choose one of {names}", EXIT_BAD_CONFIG)
        show_config(configs[command], config, sets)

    first = next(iter(configs))
    show_of.__doc__ = CONFIG_SHOW_HELP.format(
        what=f"`{script} COMMAND` ({names})", prefix=prefix, example=example, show=f"{script} config show {first}"
    )
    config_app.command("show")(show_of)
    return config_app
