"""`prime-worker`: the contributor's command."""

from __future__ import annotations

from pathlib import Path

import typer

from protocol.errors import ConfigError
from runtime.cli import (
    ConfigOption,
    JsonLogsOption,
    LogLevelOption,
    NoP2POption,
    PrimeTyper,
    fail,
    load_role_config,
    make_config_app,
    make_keys_app,
    set_option,
    start_logging,
)
from runtime.slurm import DryRunOption, GpusPerNodeOption, PartitionOption, SbatchArgOption, TimeOption, print_or_submit
from worker.config import WorkerConfig

SetOption = set_option("gpu=none")

app = PrimeTyper(
    help="Contribute GPUs (or a CPU) to a prime-network run: generate rollouts, prove them, get credit.",
    no_args_is_help=True,
)
app.add_typer(make_keys_app(WorkerConfig, "prime-worker", "data_dir=/srv/worker"), name="keys")
app.add_typer(make_config_app("prime-worker", {"join": WorkerConfig}, "gpu=none"), name="config")


@app.command()
def join(
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    coordinator: str | None = typer.Option(None, help="Coordinator URL, e.g. http://1.2.3.4:8000."),
    gpu: str | None = typer.Option(None, help="'all', 'none' or indices like '0,1': one engine per GPU."),
    engine: str | None = typer.Option(None, help="auto, vllm or hf."),
    relay: list[str] | None = typer.Option(None, help="Extra relay URL (repeatable)."),
    also_join: list[str] | None = typer.Option(
        None,
        help="Coordinator URL of another LoRA run on the same base (repeatable): one copy of the base serves them all.",
    ),
    data_dir: Path | None = typer.Option(None, help="Node key and downloaded weights."),
    no_p2p: bool = NoP2POption,
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
) -> None:
    """Join a run: register, lease tasks, generate, prove and submit until stopped (Ctrl-C).

    With --also-join, work for several LoRA runs on one base at once (each run its own coordinator and ledger;
    their task loops take turns on the engines): `prime-worker join --coordinator URL_A --also-join URL_B`.

    Exit codes: 0 the run ended; 3 the coordinator refuses this worker;
    4 it refused a request; 2 an invalid config; 1 any other error;
    130 Ctrl-C or SIGTERM: stops within seconds, whatever the worker does
    (starting its engine, downloading); a second Ctrl-C stops it at once.
    """
    start_logging(log_level, json_logs)
    flags: dict[str, object] = {"coordinator_url": coordinator, "gpu": gpu, "engine": engine}
    flags.update({"relays": relay or None, "also_join": also_join or None, "data_dir": data_dir})
    flags["p2p.enabled"] = False if no_p2p else None
    settings = load_role_config(WorkerConfig, config, sets, flags)
    from worker.join import run_join

    raise typer.Exit(run_join(settings, show_live_status=not json_logs))


@app.command()
def slurm(
    workers: int = typer.Option(..., "--workers", "-n", min=1, help="Array size: workers to run, one node each."),
    config: Path | None = ConfigOption,
    sets: list[str] | None = SetOption,
    coordinator: str | None = typer.Option(None, help="Coordinator URL, e.g. http://1.2.3.4:8000."),
    gpu: str = typer.Option("all", help="GPUs each worker uses on its node: 'all', 'none' or indices like '0,1'."),
    engine: str | None = typer.Option(None, help="auto, vllm or hf."),
    relay: list[str] | None = typer.Option(None, help="Extra relay URL (repeatable)."),
    data_dir: Path = typer.Option(
        WorkerConfig.model_fields["data_dir"].default / "slurm",
        help="Shared base dir: array task I keeps its node key and weights in DATA_DIR/worker-I.",
    ),
    no_p2p: bool = NoP2POption,
    exclusive: bool = typer.Option(True, help="Give each worker its node to itself (sbatch --exclusive)."),
    partition: str | None = PartitionOption,
    time: str | None = TimeOption,
    gpus_per_node: str | None = GpusPerNodeOption,
    sbatch_args: list[str] | None = SbatchArgOption,
    dry_run: bool = DryRunOption,
) -> None:
    """Submit WORKERS workers as a SLURM job array over a (GPU) partition: `join` on one node per array task.

    Each task keeps its own data dir (DATA_DIR/worker-<array index>), so a requeued task resumes as the same
    node. `scancel` stops the workers cleanly: each submits the task it is generating and abandons the rest.
    """
    flags: dict[str, object] = {"coordinator_url": coordinator, "gpu": gpu, "engine": engine}
    flags.update({"relays": relay or None, "p2p.enabled": False if no_p2p else None})
    load_role_config(WorkerConfig, config, sets, flags)  # a bad config fails here, not on every node
    from worker.slurm import join_flags, worker_job

    join = join_flags(config, sets or [], gpu, coordinator, engine, relay or [], p2p_enabled=not no_p2p)
    try:
        job = worker_job(
            workers,
            join,
            data_dir,
            partition=partition,
            time=time,
            gpus_per_node=gpus_per_node,
            exclusive=exclusive,
            extra=sbatch_args,
        )
    except ConfigError as exc:
        fail(exc.message)
    print_or_submit(job, dry_run)


@app.command()
def status(
    coordinator: str = typer.Option("http://127.0.0.1:8000", help="Coordinator URL."),
    data_dir: Path = typer.Option(WorkerConfig.model_fields["data_dir"].default, help="The worker's data dir."),
) -> None:
    """Show this node's standing with a coordinator: accepted, rejected, credit (verified work), banned."""
    from worker.standing import show_standing

    raise typer.Exit(show_standing(coordinator, data_dir))
