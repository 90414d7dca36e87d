"""SLURM batch jobs for the role commands: render an sbatch script, print it, or submit it with ``sbatch``.

`prime-coordinator slurm` and `prime-worker slurm` each describe their job as a :class:`BatchJob`
(the ``#SBATCH`` header options and a bash body that runs our own commands); this module renders
the script, and either prints it (``--dry-run``) or pipes it to ``sbatch --parsable`` and returns
the job id. Every job is requeueable (``--requeue``) and appends to its output file, because a
requeued job reruns the same script on the same data dir: the ledger and the trainer checkpoint
make that a resume. The typer options every ``slurm`` command shares live here too.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import typer

from protocol.errors import ConfigError
from runtime.cli import fail

PartitionOption = typer.Option(None, "--partition", "-p", help="SLURM partition to submit to (sbatch --partition).")
TimeOption = typer.Option(None, "--time", help="Wall-clock limit, e.g. 24:00:00 (sbatch --time).")
GpusPerNodeOption = typer.Option(None, "--gpus-per-node", help="GPUs per node (sbatch --gpus-per-node).")
SbatchArgOption = typer.Option(
    None, "--sbatch-arg", help="Any other sbatch option, e.g. --sbatch-arg=--account=lab (repeatable)."
)
DryRunOption = typer.Option(False, "--dry-run", help="Print the batch script instead of submitting it.")


@dataclass(frozen=True)
class BatchJob:
    """One sbatch script: its ``#SBATCH`` options and the bash lines that run in it."""

    name: str
    body: list[str]
    output: str
    """Output file pattern (sbatch --output), e.g. ``runs/demo/slurm-%j.out``."""
    nodes: int = 1
    array: str | None = None
    partition: str | None = None
    time: str | None = None
    gpus_per_node: str | None = None
    exclusive: bool = False
    extra: list[str] = field(default_factory=list)
    """Raw sbatch options (``--account=lab``), written as given after ours."""

    def options(self) -> list[str]:
        options = [f"--job-name={self.name}", f"--nodes={self.nodes}", "--ntasks-per-node=1"]
        options += [f"--output={self.output}", "--open-mode=append", "--requeue"]
        if self.array is not None:
            options.append(f"--array={self.array}")
        for flag, value in (("partition", self.partition), ("time", self.time), ("gpus-per-node", self.gpus_per_node)):
            if value is not None:
                options.append(f"--{flag}={value}")
        if self.exclusive:
            options.append("--exclusive")
        for option in self.extra:
            if not option.startswith("-") or "\n" in option:
                raise ConfigError(f"--sbatch-arg {option!r} is not an sbatch option: give it as --name=value")
            options.append(option)
        return options


def render(job: BatchJob) -> str:
    """The batch script of ``job``."""
    header = [f"#SBATCH {option}" for option in job.options()]
    return "\n".join(["#!/bin/bash", *header, "set -euo pipefail", *job.body]) + "\n"


def role_command(name: str) -> str:
    """The absolute path of our console script ``name`` in this environment (the job runs the same install)."""
    script = Path(sys.executable).parent / name
    return str(script) if script.exists() else name


def quote(argv: list[str]) -> str:
    """``argv`` as one bash command line."""
    return " ".join(shlex.quote(arg) for arg in argv)


def submit(script: str, sbatch: str = "sbatch") -> str:
    """Submit ``script`` with ``sbatch --parsable`` and return the job id."""
    binary = shutil.which(sbatch)
    if binary is None:
        raise ConfigError(f"{sbatch} is not on PATH: run this on a SLURM login node (or print the script: --dry-run)")
    done = subprocess.run([binary, "--parsable"], input=script, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise ConfigError(f"sbatch refused the job: {reason} (print the script with --dry-run)")
    return done.stdout.strip().split(";")[0]


def print_or_submit(job: BatchJob, dry_run: bool) -> None:
    """The ``slurm`` commands' last step: print the script, or submit it and print the job id."""
    try:
        script = render(job)
        if dry_run:
            typer.echo(script, nl=False)
            return
        Path(job.output).parent.mkdir(parents=True, exist_ok=True)  # sbatch does not create it
        job_id = submit(script)
    except ConfigError as exc:
        fail(exc.message)
    typer.echo(f"submitted batch job {job_id} ({job.name}); output in {job.output}")
