"""`prime-worker`: the contributor's command."""

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
from worker.config import WorkerConfig

app = typer.Typer(
    help="Contribute GPUs (or a CPU) to a prime-network run: generate rollouts, prove them, get credit.",
    no_args_is_help=True,
)
app.add_typer(make_keys_app(WorkerConfig.model_fields["data_dir"].default), name="keys")


@app.command()
def join(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    coordinator: str | None = typer.Option(None, help="Coordinator URL, e.g. http://1.2.3.4:8000."),
    gpu: str | None = typer.Option(None, help="'all', 'none' or indices like '0,1': one engine per GPU."),
    engine: str | None = typer.Option(None, help="auto, vllm or hf."),
    relay: list[str] | None = typer.Option(None, help="Extra relay URL (repeatable)."),
    data_dir: Path | None = typer.Option(None, help="Node key and downloaded weights."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Join a run: register, lease tasks, generate, prove and submit until stopped (Ctrl-C)."""
    start_logging(log_level, json_logs)
    flags: dict[str, object] = {"coordinator_url": coordinator, "gpu": gpu, "engine": engine}
    flags.update({"relays": relay or None, "data_dir": data_dir})
    load_role_config(WorkerConfig, config, sets, flags)
    not_yet_built("the worker task loop", 7)


@app.command()
def status(
    coordinator: str = typer.Option("http://127.0.0.1:8000", help="Coordinator URL."),
) -> None:
    """Show this node's standing with a coordinator (accepted, rejected, banned)."""
    not_yet_built("worker status", 7)
