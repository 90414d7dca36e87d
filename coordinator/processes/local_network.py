"""A whole network on 127.0.0.1 as the coordinator's children: relay, workers, validator (`[local_network]`).

With ``local_network.enabled`` the coordinator starts, once its API answers, a SHARDCAST relay
mirroring its origin, one CPU worker per configured engine (vLLM, HF) fetching policies
through the relay, and validators; each with its own data dir and log under
``<data_dir>/network/``. Each child gets SIGKILL if the coordinator dies (no orphans after a
crash; a restart starts them again, with the same node keys), and is stopped by its PID when
the run ends.

The children share the machine's cores with the trainer's ranks (one thread each under torchrun): they
compute with one OpenMP thread each too, unless ``OMP_NUM_THREADS`` says otherwise. Measured on 2 cores
(the learning bench at async level 1), a validator recomputing with both cores while the trainer trained
made a step about 20% slower than with one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from coordinator.config import LocalNetworkConfig
from runtime.children import Child, LogLimits, sharing_cores_env, stop_children
from runtime.ports import free_port

BIN = Path(sys.executable).parent


class Processes:
    """Named child processes, each logging to ``<root>/<name>.log`` (rotated) and stopped by its PID."""

    def __init__(self, root: Path, cpus: list[int] | None = None, limits: LogLimits = LogLimits()) -> None:
        self.root = root
        self.cpus = cpus or []
        self.limits = limits
        self.children: dict[str, Child] = {}

    def start(self, name: str, argv: list[str]) -> None:
        log_path = self.root / f"{name}.log"
        child = Child(name, argv, log_path, cpus=self.cpus, limits=self.limits, env=sharing_cores_env())
        child.start()
        self.children[name] = child

    def check(self) -> None:
        """Raise :class:`ChildExitedError` naming the first child that exited, with its log's tail."""
        for child in self.children.values():
            child.check()

    def stop_all(self) -> None:
        stop_children(list(self.children.values()), timeout_s=30)

    def nodes_running(self) -> list[str]:
        """The workers and validators still running (the relay serves until stopped, so it is not counted)."""
        return [name for name, code in self.node_exit_codes().items() if code is None]

    def node_exit_codes(self) -> dict[str, int | None]:
        """Each worker's and validator's exit code, None while it runs."""
        return {name: child.returncode for name, child in self.children.items() if name != "relay"}


def start_local_network(
    config: LocalNetworkConfig, url: str, coordinator_id: str, root: Path, limits: LogLimits = LogLimits()
) -> Processes:
    """Start the relay, workers and validators of ``config`` against the coordinator at ``url``."""
    procs = Processes(root, config.cpus, limits)
    source = f"{url}/shardcast"
    if config.relay_enabled:
        relay_port = free_port()
        relay = f"http://127.0.0.1:{relay_port}"
        procs.start(
            "relay",
            [
                str(BIN / "prime-relay"),
                "serve",
                "--upstream",
                source,
                "--port",
                str(relay_port),
                "--coordinator-id",
                coordinator_id,
                "--data-dir",
                str(root / "relay"),
                "--json-logs",
            ],
        )
        source = relay
    for index, engine in enumerate(config.engines):
        name = f"worker-{engine}" if config.engines.count(engine) == 1 else f"worker-{engine}-{index}"
        procs.start(
            name,
            [
                str(BIN / "prime-worker"),
                "join",
                "--coordinator",
                url,
                "--relay",
                source,
                "--engine",
                engine,
                "--gpu",
                "none",
                "--data-dir",
                str(root / name),
                "--json-logs",
            ],
        )
    for index in range(config.num_validators):
        name = "validator" if config.num_validators == 1 else f"validator-{index}"
        procs.start(
            name,
            [str(BIN / "prime-validator"), "run", "--coordinator", url, "--data-dir", str(root / name), "--json-logs"],
        )
    return procs
