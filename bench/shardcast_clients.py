"""Processes of the shardcast benches: warm download clients told a version on stdin, each stopped by its PID.

:data:`OUR_CLIENT` is a worker-like download client (run with ``python -c``); :func:`start_waiting_clients`
starts such clients (ours or the reference's), which import what they need and say "ready" before the clock
starts, and :func:`tell` gives them the version to fetch. :class:`Processes` keeps every process a bench
starts, its output in a log file, and stops them all with :func:`runtime.children.stop_processes`.
Used by bench/shardcast_bench.py and bench/patch_bench.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime.children import stop_processes

OUR_CLIENT = r'''
"""A worker-like process: imports first, then downloads the version it is told (benchmark harness)."""
import json, sys
from pathlib import Path
from shardcast.client.download import download_version
from shardcast.client.transfer import TransferOptions

relays, coordinator_id, out, fsync = sys.argv[1].split(","), sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "1"
print("ready", flush=True)
version = int(sys.stdin.readline())
emit = lambda event: print(json.dumps(event), flush=True)
download_version(version, relays, coordinator_id, out, TransferOptions(fsync_enabled=fsync), on_event=emit)
'''


class Processes:
    """Every process a bench starts, each stopped by its PID at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], log_path: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` with its output (stderr, and stdout unless given) appended to ``log_path``."""
        handle = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(list(argv), stdout=kwargs.pop("stdout", handle), stderr=handle, **kwargs)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM every process still running, SIGKILL those that have not exited within 10 s."""
        stop_processes(self.procs, timeout_s=10)
        self.procs.clear()


def start_waiting_clients(
    procs: Processes, argvs: list[list[str]], logs: Path, envs: Sequence[dict[str, str] | None] = (), **kwargs: Any
) -> list[subprocess.Popen[bytes]]:
    """Start client processes that import what they need, say "ready", and wait for a version on stdin.

    Both systems' clients are warm, as a worker is when a new version is announced; interpreter
    start-up is not part of either figure.
    """
    clients = []
    for index, argv in enumerate(argvs):
        env = envs[index] if envs else None
        log_path = logs / f"client{index}.log"
        proc = procs.start(argv, log_path, stdout=subprocess.PIPE, stdin=subprocess.PIPE, env=env, **kwargs)
        clients.append(proc)
    for proc in clients:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"a client did not start; see {logs}")
    return clients


def tell(clients: list[subprocess.Popen[bytes]], line: str) -> None:
    """Write ``line`` (the version to fetch) to every waiting client's stdin."""
    for proc in clients:
        assert proc.stdin is not None
        proc.stdin.write(f"{line}\n".encode())
        proc.stdin.flush()
