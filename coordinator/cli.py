"""`prime-coordinator`: the operator's command."""

from __future__ import annotations

from pathlib import Path

import typer

from coordinator.config import CoordinatorConfig
from runtime.cli import (
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    PrimeTyper,
    fail,
    load_role_config,
    make_config_app,
    make_keys_app,
    run_or_exit,
    set_option,
    start_logging,
)
from runtime.slurm import DryRunOption, GpusPerNodeOption, PartitionOption, SbatchArgOption, TimeOption, print_or_submit

SetOption = set_option("api.port=8001")

app = PrimeTyper(
    help=(
        "Run a prime-network coordinator: the task ledger API, the SHARDCAST origin and, when configured, "
        "the RL loop with its torchrun trainer and a local demo network."
    ),
    no_args_is_help=True,
)
app.add_typer(make_keys_app(CoordinatorConfig, "prime-coordinator", "data_dir=runs/my-run"), name="keys")
app.add_typer(make_config_app("prime-coordinator", {"start": CoordinatorConfig}, "api.port=8001"), name="config")

DataDirOption = typer.Option(None, "--data-dir", help="Run directory (data_dir).")
LedgerUrlOption = typer.Option(None, "--ledger-url", help="SQLAlchemy URL of the ledger (ledger.url).")


@app.command()
def start(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    host: str | None = typer.Option(None, help="Interface for the ledger API (api.host)."),
    port: int | None = typer.Option(None, help="Port for the ledger API (api.port)."),
    data_dir: Path | None = DataDirOption,
    ledger_url: str | None = LedgerUrlOption,
    api_only: bool = typer.Option(
        False,
        "--api-only",
        help="Serve only the ledger API of a run whose coordinator is already running on the same PostgreSQL "
        "ledger.url: an API replica behind a load balancer (deploy/haproxy.cfg), with no trainer, origin or key.",
    ),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Start (or resume) the run: ledger API (uvicorn), SHARDCAST origin and, when configured, the RL loop
    with its trainer (config section orchestrator) and a local network of relay, workers and validator
    (config section local_network). With --api-only: one more API process for a running run."""
    start_logging(log_level, json_logs)
    flags = {"api.host": host, "api.port": port, "data_dir": data_dir, "ledger.url": ledger_url}
    loaded = load_role_config(CoordinatorConfig, config, sets, flags)
    if api_only:
        from coordinator.serving.replica import run_api_replica

        run_or_exit("coordinator", run_api_replica, loaded)
        return
    from coordinator.start import run

    run_or_exit("coordinator", run, loaded)


@app.command()
def publish(
    checkpoint: Path = typer.Argument(..., help="HF checkpoint directory (safetensors, config, tokenizer)."),
    version: int | None = typer.Option(None, help="Version number (default: the current one + 1)."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    data_dir: Path | None = DataDirOption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Publish a checkpoint as the run's next policy version: signed, sharded, served at /shardcast."""
    start_logging(log_level, json_logs)
    loaded = load_role_config(CoordinatorConfig, config, sets, {"data_dir": data_dir})
    from coordinator.publish import publish_from_cli

    run_or_exit("coordinator", publish_from_cli, loaded, checkpoint, version)


@app.command()
def status(
    coordinator: str | None = typer.Option(None, help="The coordinator's URL (default: from the config's api)."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Show a running run: step and ETA, live workers and validators, accepted and rejected submissions."""
    start_logging(log_level, json_logs)
    from coordinator.serving.run_status import show_status, status_url

    if coordinator is None:
        coordinator = status_url(load_role_config(CoordinatorConfig, config, sets))
    run_or_exit("coordinator", show_status, coordinator)


validators_app = PrimeTyper(help="Approve or revoke validators on a live run (no restart), and list them.")
app.add_typer(validators_app, name="validators")


def _validator_command(node_id: str | None, approved: bool | None, config: Path | None, sets: list[str] | None) -> None:
    loaded = load_role_config(CoordinatorConfig, config, sets)
    from coordinator.ledger.approvals import validators_from_cli

    run_or_exit("coordinator", validators_from_cli, loaded, node_id, approved)


@validators_app.command("approve")
def approve_validator(
    node_id: str = typer.Argument(..., help="The validator's node id (`prime-validator keys show --id-only`)."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
) -> None:
    """Approve a validator: it is admitted on its next registration, whatever trust.approved_validators says."""
    _validator_command(node_id, True, config, sets)


@validators_app.command("revoke")
def revoke_validator(
    node_id: str = typer.Argument(..., help="The validator's node id."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
) -> None:
    """Revoke a validator: its next call is refused (403), even if trust.approved_validators lists it."""
    _validator_command(node_id, False, config, sets)


@validators_app.command("list")
def list_validators(config: Path | None = ConfigOption, sets: list[str] | None = SetOption) -> None:
    """The run's validators: approved or not, by the config or by a decision on the live run, registered or not."""
    _validator_command(None, None, config, sets)


@app.command()
def rollback(
    to: str = typer.Option(..., "--to", help="The version to go back to: vN or N (one the run published)."),
    reason: str = typer.Option("asked for by the operator", help="Why, for the ledger's event log and the console."),
    lr_scale: float = typer.Option(1.0, "--lr-scale", help="Multiply the learning rate by this from then on."),
    pause: bool = typer.Option(False, help="Pause the run once the rollback is published."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    data_dir: Path | None = DataDirOption,
    ledger_url: str | None = LedgerUrlOption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Roll a run back to an earlier version: its weights are published again as the next version (workers and
    relays follow it like any other), the steps after it are marked rolled back, and training goes on from it.
    Safe while the run goes on (the RL loop does it before its next step); on a stopped run, at its next start.
    The version's weights must still be kept: in the origin store, or as the canary's best."""
    start_logging(log_level, json_logs)
    version = to.removeprefix("v")
    if not version.isdigit():
        fail(f"--to {to!r}: give a version as vN or N, e.g. --to v3")
    if not 0 < lr_scale <= 1:
        fail(f"--lr-scale {lr_scale}: give a factor in (0, 1]")
    loaded = load_role_config(CoordinatorConfig, config, sets, {"data_dir": data_dir, "ledger.url": ledger_url})
    from coordinator.rollback import rollback_from_cli

    run_or_exit("coordinator", rollback_from_cli, loaded, int(version), reason, lr_scale, pause)


@app.command()
def reset(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    data_dir: Path | None = DataDirOption,
    ledger_url: str | None = LedgerUrlOption,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Start the run over: delete its ledger tables (SQLite or PostgreSQL) and its data dir (node key, policies,
    trainer checkpoints, logs). The next `start` with the same config begins a fresh run at step 0 with a new
    coordinator key: workers and relays must be given the new id. Refused while a coordinator runs the run."""
    start_logging(log_level, json_logs)
    loaded = load_role_config(CoordinatorConfig, config, sets, {"data_dir": data_dir, "ledger.url": ledger_url})
    from coordinator.reset import reset_run

    run_or_exit("coordinator", reset_run, loaded, yes)


@app.command()
def export(
    steps: str = typer.Option(..., help="Training steps to export: A:B (inclusive), A: (to the newest) or N."),
    out: Path = typer.Option(..., help="File to write (replaced whole once complete)."),
    fmt: str = typer.Option("parquet", "--format", help="parquet or jsonl."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    data_dir: Path | None = DataDirOption,
    ledger_url: str | None = LedgerUrlOption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Export the rollouts the RL loop trained on (tokens, logprobs, rewards, advantages, verdicts) for analysis
    or SFT; archived bodies are read from the archive. Safe while the run goes on."""
    start_logging(log_level, json_logs)
    if fmt not in ("parquet", "jsonl"):
        fail(f"--format {fmt!r}: choose parquet or jsonl")
    loaded = load_role_config(CoordinatorConfig, config, sets, {"data_dir": data_dir, "ledger.url": ledger_url})
    from coordinator.ledger.export import export_from_cli

    run_or_exit("coordinator", export_from_cli, loaded, steps, fmt, out)


metrics_app = PrimeTyper(help="The run's per-step metrics (trainer and batch figures, evals), from its ledger.")
app.add_typer(metrics_app, name="metrics")


@metrics_app.command("export")
def export_metrics(
    fmt: str = typer.Option("csv", "--format", help="csv or jsonl."),
    output: Path | None = typer.Option(None, "--output", "-o", help="File to write (default: standard output)."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    data_dir: Path | None = DataDirOption,
    ledger_url: str | None = LedgerUrlOption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Export every trained step's metrics (loss, entropy, mismatch KL, grad norm, the batch's reward, length,
    stop and truncated fractions ...) and every eval, read from the run's ledger, as CSV or JSON lines (the rows
    of data_dir/metrics.jsonl). Safe while the run goes on."""
    start_logging(log_level, json_logs)
    if fmt not in ("csv", "jsonl"):
        fail(f"--format {fmt!r}: choose csv or jsonl")
    loaded = load_role_config(CoordinatorConfig, config, sets, {"data_dir": data_dir, "ledger.url": ledger_url})
    from coordinator.loop.metrics_export import export_metrics_from_cli

    run_or_exit("coordinator", export_metrics_from_cli, loaded, fmt, output)


@app.command()
def archive(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    data_dir: Path | None = DataDirOption,
    ledger_url: str | None = LedgerUrlOption,
    compact: bool = typer.Option(False, help="SQLite: VACUUM afterwards, to return the freed space to the disk."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Move old submission bodies and events out of the ledger database into Parquet files (config section
    archive: keep_versions, keep_events_s, dir). Safe while the run goes on."""
    start_logging(log_level, json_logs)
    loaded = load_role_config(CoordinatorConfig, config, sets, {"data_dir": data_dir, "ledger.url": ledger_url})
    from coordinator.ledger.archive import archive_from_cli

    run_or_exit("coordinator", archive_from_cli, loaded, compact)


@app.command()
def slurm(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    partition: str | None = PartitionOption,
    time: str | None = TimeOption,
    gpus_per_node: str | None = GpusPerNodeOption,
    sbatch_args: list[str] | None = SbatchArgOption,
    dry_run: bool = DryRunOption,
) -> None:
    """Submit the run as one SLURM job: `start` on the first node, `prime-trainer node` on the others.

    The job takes orchestrator.trainer_launch.nnodes nodes. The first runs the coordinator (ledger API, RL loop,
    trainer node rank 0, torchrun's rendezvous); each other node runs `prime-trainer node` with its node
    rank, dialling the first node on orchestrator.trainer_launch.master_port. data_dir must be on a filesystem
    every node shares. The job is requeueable: a requeued job resumes the run from its data dir.
    """
    loaded = load_role_config(CoordinatorConfig, config, sets)
    from coordinator.processes.slurm import coordinator_job

    job = coordinator_job(
        loaded,
        config,
        sets or [],
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        extra=sbatch_args,
    )
    print_or_submit(job, dry_run)
