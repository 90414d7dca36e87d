"""The coordinator's SLURM job: the coordinator and its multi-node trainer as one allocation.

One ``srun`` task per allocated node (``orchestrator.trainer_launch.nnodes`` nodes). SLURM's node 0
(``SLURM_NODEID`` 0, the first host of ``scontrol show hostnames $SLURM_JOB_NODELIST``) runs
`prime-coordinator start`, which launches trainer node rank 0 and hosts torchrun's rendezvous
there (``orchestrator.trainer_launch.master_addr`` is set to that host); every other node waits for the
run's trainer spec in the shared train dir and runs `prime-trainer node` with its SLURM node id
as node rank. The job is requeueable: a requeued job reruns the same command on the same data
dir, and the coordinator resumes the run from its ledger and the last trainer checkpoint.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from coordinator.config import CoordinatorConfig
from runtime.slurm import BatchJob, quote, role_command
from trainer.launch import SPEC_FILE

SPEC_WAIT_S = 1800
"""How long a trainer node waits for the coordinator to write the run's trainer spec."""


def coordinator_job(
    config: CoordinatorConfig,
    config_path: Path | None,
    sets: list[str],
    *,
    partition: str | None = None,
    time: str | None = None,
    gpus_per_node: str | None = None,
    extra: list[str] | None = None,
) -> BatchJob:
    """The batch job that runs ``config``'s coordinator (and its trainer nodes) as `prime-coordinator start` would."""
    launch = config.orchestrator.trainer_launch
    nnodes = launch.nnodes if config.orchestrator.enabled else 1
    workdir = Path.cwd()
    data_dir = config.data_dir if config.data_dir.is_absolute() else workdir / config.data_dir
    start = [role_command("prime-coordinator"), "start", "--json-logs"]
    if config_path is not None:
        start += ["-c", str(config_path.resolve())]
    for item in sets:
        start += ["--set", item]
    node = [
        role_command("prime-trainer"),
        "node",
        "--train-dir",
        str(data_dir / "train"),
        "--nnodes",
        str(nnodes),
        "--master-port",
        str(launch.master_port),
        "--nproc-per-node",
        str(launch.nproc),
    ]
    spec = data_dir / "train" / SPEC_FILE
    # The per-node step runs under srun; $MASTER_ADDR and $SLURM_NODEID are expanded there, on each node.
    step = [
        'if [ "$SLURM_NODEID" = 0 ]; then',
        f'  exec {quote(start)} --set "orchestrator.trainer_launch.master_addr=\\"$MASTER_ADDR\\""',
        "fi",
        f"for _ in $(seq {SPEC_WAIT_S}); do [ -f {shlex.quote(str(spec))} ] && break; sleep 1; done",
        f'exec {quote(node)} --node-rank "$SLURM_NODEID" --master-addr "$MASTER_ADDR"',
    ]
    body = [
        f"cd {shlex.quote(str(workdir))}",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export MASTER_ADDR",
        f"export OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}",
        "read -r -d '' node_step <<'STEP' || true",
        *step,
        "STEP",
        'echo "prime-coordinator: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous on $MASTER_ADDR"',
        f'exec srun --nodes={nnodes} --ntasks={nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$node_step"',
    ]
    return BatchJob(
        name=f"prime-coordinator-{config.run_name}",
        body=body,
        output=str(data_dir / "slurm-%j.out"),
        nodes=nnodes,
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        exclusive=True,  # each trainer node (and the coordinator's) takes its whole node: CPUs, GPUs, memory
        extra=list(extra or []),
    )
