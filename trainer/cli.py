"""`prime-trainer`: SFT and evaluation without the network."""

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
from trainer.config import SftConfig

app = typer.Typer(help="Train and evaluate policies locally (SFT, eval).", no_args_is_help=True)


@app.command()
def sft(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    output_dir: Path | None = typer.Option(None, help="Where checkpoints and the exported policy go."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Supervised fine-tuning on a task's prompt/completion pairs (loss on completions only)."""
    start_logging(log_level, json_logs)
    load_role_config(SftConfig, config, sets, {"output_dir": output_dir})
    not_yet_built("SFT", 6)


@app.command("eval")
def evaluate(
    model: Path = typer.Argument(..., help="HF checkpoint directory to evaluate."),
    task: str = typer.Option("reverse_text", help="Built-in task."),
) -> None:
    """Run a task's eval set and report reward and accuracy."""
    not_yet_built("eval", 6)
