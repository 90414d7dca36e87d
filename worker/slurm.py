"""Workers as a SLURM job array: one `prime-worker join` per array task, one node each.

Array task ``i`` runs on a node of its own (``--exclusive`` by default, so it owns every GPU
there: ``--gpu all``) with its own data dir, ``<data dir>/worker-<i>``: its node key and its
downloaded weights. A requeued task (after preemption) reruns on the same data dir, so it keeps
its node id and its standing with the coordinator. Cancelling the job (``scancel``) sends SIGTERM,
on which the worker stops leasing, submits the task it is generating, abandons any other lease it
holds and exits (before SLURM's KillWait), so no lease waits out its TTL.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from protocol.errors import ConfigError
from runtime.slurm import BatchJob, quote, role_command

MAX_ARRAY = 10_000


def join_flags(
    config: Path | None,
    sets: list[str],
    gpu: str,
    coordinator: str | None,
    engine: str | None,
    relays: list[str],
    p2p_enabled: bool,
) -> list[str]:
    """The flags of `prime-worker join` that give each array task what `prime-worker slurm` was given."""
    args = [] if config is None else ["-c", str(config.resolve())]
    args += [arg for item in sets for arg in ("--set", item)]
    args += ["--gpu", gpu] + ([] if coordinator is None else ["--coordinator", coordinator])
    args += ([] if engine is None else ["--engine", engine]) + ([] if p2p_enabled else ["--no-p2p"])
    args += [arg for url in relays for arg in ("--relay", url)]
    return args


def worker_job(
    num_workers: int,
    join_args: list[str],
    data_dir: Path,
    *,
    name: str = "prime-worker",
    partition: str | None = None,
    time: str | None = None,
    gpus_per_node: str | None = None,
    exclusive: bool = True,
    extra: list[str] | None = None,
) -> BatchJob:
    """A job array of ``num_workers`` tasks, each running `prime-worker join JOIN_ARGS` on its own data dir."""
    if not 1 <= num_workers <= MAX_ARRAY:
        raise ConfigError(f"--workers {num_workers} is outside 1..{MAX_ARRAY}")
    base = data_dir.expanduser()
    base = base if base.is_absolute() else Path.cwd() / base
    join = [role_command("prime-worker"), "join", *join_args, "--json-logs"]
    body = [
        f"cd {shlex.quote(str(Path.cwd()))}",
        f'exec {quote(join)} --data-dir {shlex.quote(str(base))}/worker-"${{SLURM_ARRAY_TASK_ID:-0}}"',
    ]
    return BatchJob(
        name=name,
        body=body,
        output=str(base / "slurm-%A_%a.out"),
        array=f"0-{num_workers - 1}",
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        exclusive=exclusive,
        extra=list(extra or []),
    )
