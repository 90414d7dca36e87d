"""`prime-trainer`: SFT, a local RL loop, evaluation, the RL start checkpoint, and joining a multi-node trainer.

Thin entry points: each parses its config and calls one function imported lazily, so
``--help`` imports neither torch nor transformers. A concrete engine meets the trainer's
engine-agnostic rollout code in :mod:`trainer.local`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from protocol.errors import ConfigError
from runtime.cli import (
    EXIT_BAD_CONFIG,
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    PrimeTyper,
    fail,
    load_role_config,
    make_config_app,
    run_or_exit,
    set_option,
    start_logging,
)
from trainer.config import EvalConfig, RlConfig, SftConfig

SetOption = set_option("num_steps=20")
EvalSetOption = set_option("num_examples=64")

app = PrimeTyper(help="Train and evaluate policies locally (SFT, RL, eval).", no_args_is_help=True)
app.add_typer(
    make_config_app("prime-trainer", {"sft": SftConfig, "rl": RlConfig, "eval": EvalConfig}, "num_steps=20"),
    name="config",
)


@app.command()
def sft(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    output_dir: Path | None = typer.Option(None, help="Where checkpoints and the exported policy go."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Supervised fine-tuning on a task's prompt/completion pairs (loss on completions only).

    Runs in one process, or sharded with FSDP2 under torchrun:
    `torchrun --nproc-per-node 2 -m trainer.cli sft -c configs/sft.toml`.
    """
    start_logging(log_level, json_logs)
    loaded = load_role_config(SftConfig, config, sets, {"output_dir": output_dir})
    from trainer.sft import run_sft

    run_or_exit("sft", run_sft, loaded)


@app.command()
def rl(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    output_dir: Path | None = typer.Option(None, help="Where metrics, checkpoints and the policy go."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """A local synchronous RL run: the trainer and the HF engine in one loop (one process)."""
    start_logging(log_level, json_logs)
    loaded = load_role_config(RlConfig, config, sets, {"output_dir": output_dir})
    from trainer.local import run_local_rl

    typer.echo(json.dumps(run_local_rl(loaded)))


@app.command("eval")
def evaluate(
    config: Path | None = ConfigOption,
    sets: list[str] | None = EvalSetOption,
    model: str | None = typer.Option(
        None, help="HF checkpoint directory, built-in name, or LoRA adapter directory (on the base it names)."
    ),
    task: str | None = typer.Option(
        None, help="Built-in environment whose eval set is run (reverse_text, arithmetic, sort_digits, calculator)."
    ),
    num_examples: int | None = typer.Option(None, help="Eval set size."),
    output: Path | None = typer.Option(None, help="Also write the JSON report to this file (atomically)."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Run a task's eval set with the HF engine; print reward and accuracy as JSON."""
    start_logging(log_level, json_logs)
    builtin = {"environment.type": "builtin", "environment.name": task} if task else {}
    flags = {"model": model, "num_examples": num_examples, **builtin}
    loaded = load_role_config(EvalConfig, config, sets, flags)
    from trainer.local import run_eval

    typer.echo(json.dumps(run_eval(loaded, output)))


@app.command("start-checkpoint")
def start_checkpoint(
    names: list[str] | None = typer.Argument(
        None,
        help="Built-in models to build, as in a config (builtin:small-qwen3-calculator-start; the prefix may be left "
        "out), or `all` (default: the demo's RL start, builtin:small-qwen3-sort-start).",
        show_default=False,
    ),
    output_dir: Path | None = typer.Option(
        None, help="Build the one model named into this new directory instead of the built-in cache."
    ),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Build built-in models ahead of time (a start is an SFT run: a minute or two each on 2 cores, longer on a busy
    machine) into the built-in cache ($PRIME_BUILTIN_DIR, default ~/.prime-network/builtin), so that a coordinator,
    worker or validator that names one starts at once. Prints each model's directory."""
    start_logging(log_level, json_logs)
    from trainer.resolve import BUILDERS, DEMO_START, build_builtin

    wanted = list(names or [DEMO_START])
    if wanted == ["all"]:
        wanted = list(BUILDERS)
    if output_dir is not None and len(wanted) != 1:
        fail(
            f"--output-dir takes one model, and {len(wanted)} are named: name one, or build them into the cache",
            EXIT_BAD_CONFIG,
        )
    for name in wanted:
        try:
            typer.echo(str(build_builtin(name, output_dir)))
        except ConfigError as exc:
            fail(exc.message, EXIT_BAD_CONFIG)


@app.command()
def node(
    train_dir: Path = typer.Option(
        ...,
        help="The run's train dir (<data_dir>/train of the coordinator), on a filesystem every trainer node shares, "
        "at the same path on each.",
    ),
    nnodes: int = typer.Option(
        ..., min=2, help="Machines in the trainer job (the coordinator's orchestrator.trainer_launch.nnodes)."
    ),
    node_rank: int = typer.Option(..., min=1, help="This machine's node rank, 1..nnodes-1 (0 is the coordinator's)."),
    master_addr: str = typer.Option(
        ..., help="The coordinator machine's address (its orchestrator.trainer_launch.master_addr)."
    ),
    master_port: int = typer.Option(
        ..., min=1, max=65535, help="Its rendezvous port (orchestrator.trainer_launch.master_port)."
    ),
    nproc_per_node: int = typer.Option(2, min=1, help="Trainer ranks on this machine (one per GPU)."),
) -> None:
    """Join a multi-node trainer from another machine: runs `torchrun ... -m trainer.service` as node NODE_RANK.

    Start the coordinator first (with orchestrator.trainer_launch.nnodes = NNODES and a fixed master_port there): it
    writes the run's spec into the train dir and launches node 0, which waits here for the others. The train dir
    must be on a shared filesystem (NFS, Lustre, ...) mounted at the same path on every node: batches, checkpoints
    and exported policies travel through it. This node stops when the run's steps are done or when the
    coordinator's node goes away.
    """
    from trainer.launch import run_trainer_node

    try:
        run_trainer_node(train_dir, nproc_per_node, nnodes, node_rank, master_addr, master_port)
    except ConfigError as exc:
        fail(exc.message)


if __name__ == "__main__":
    app()
