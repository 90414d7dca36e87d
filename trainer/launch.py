"""The torchrun command of one trainer node, for the coordinator's node and for every other machine.

The trainer service is one torchrun job spread over ``nnodes`` machines with ``nproc_per_node``
ranks each, joined by torchrun's static rendezvous at ``master_addr:master_port`` (node rank 0,
the coordinator's machine, hosts it). Every node runs the same command but for its node rank:
the coordinator launches node 0 (:mod:`coordinator.processes.trainer_process`) and an operator runs
``prime-trainer node`` on each other machine. Batches, done markers, checkpoints and exported
policies travel as files in the train dir, so that directory must be on a filesystem every node
shares, mounted at the same path. Only stdlib here: ``prime-trainer --help`` must not import torch.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from protocol.errors import ConfigError

SPEC_FILE = "service.json"
SHARED_DIR_HINT = "the train dir must be on a filesystem shared by every trainer node, at the same path on each"


@dataclass(frozen=True)
class TrainerNode:
    """Where one node sits in the trainer job."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 only with one node: torchrun is then given a free port on this machine."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ConfigError(f"nproc_per_node ({self.nproc_per_node}) and nnodes ({self.nnodes}) must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node rank {self.node_rank} is outside 0..{self.nnodes - 1} (nnodes {self.nnodes})")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"master port {self.master_port} is not a TCP port")
        if self.nnodes > 1 and self.master_port == 0:
            raise ConfigError(
                f"a trainer on {self.nnodes} nodes needs a fixed master port that every node dials "
                "(orchestrator.trainer_launch.master_port, or --master-port); 0 (a free port) works with one node only"
            )
        if not self.master_addr:
            raise ConfigError("the master address (the host of trainer node 0, dialled by the others) is empty")


def torchrun_command(train_dir: Path, node: TrainerNode, coordinator_pid: int | None) -> list[str]:
    """``torchrun ... -m trainer.service`` for ``node``.

    A one-node trainer with a master port of 0 rendezvouses ``--standalone``: torchrun binds a free port itself, so no
    other process can take the port between its choice and its use (a port chosen here and handed over can be)."""
    port = node.master_port  # never 0 on several nodes: TrainerNode refuses that
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    pid = [] if coordinator_pid is None else ["--coordinator-pid", str(coordinator_pid)]
    rendezvous = ["--master-addr", node.master_addr, "--master-port", str(port)] if port else ["--standalone"]
    return [
        *launcher,
        "--nnodes",
        str(node.nnodes),
        "--node-rank",
        str(node.node_rank),
        "--nproc-per-node",
        str(node.nproc_per_node),
        *rendezvous,
        "-m",
        "trainer.service",
        "--train-dir",
        str(train_dir),
        *pid,
    ]


def check_train_dir(train_dir: Path) -> Path:
    """The spec file of a train dir that a node can join; a clear error when there is none (yet)."""
    if not train_dir.is_dir():
        raise ConfigError(
            f"train dir {train_dir} does not exist on this machine: {SHARED_DIR_HINT} "
            "(it is <data_dir>/train of the coordinator's run)"
        )
    spec = train_dir / SPEC_FILE
    if not spec.is_file():
        raise ConfigError(
            f"{spec} is missing: start the coordinator first (it writes the spec when it launches trainer node 0), "
            f"and check that {SHARED_DIR_HINT}"
        )
    return spec


def run_trainer_node(
    train_dir: Path, nproc_per_node: int, nnodes: int, node_rank: int, master_addr: str, master_port: int
) -> NoReturn:
    """`prime-trainer node`: become (exec) torchrun as node ``node_rank`` of the trainer job whose train dir,
    checked first, is ``train_dir``; a :class:`ConfigError` when that dir or the node's place is wrong."""
    check_train_dir(train_dir)
    node = TrainerNode(nproc_per_node, nnodes, node_rank, master_addr, master_port)
    command = torchrun_command(train_dir.resolve(), node, coordinator_pid=None)
    print(f"trainer node {node_rank}/{nnodes}: {' '.join(command)}", file=sys.stderr, flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.execv(command[0], command)
