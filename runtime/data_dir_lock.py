"""One process per data dir: an exclusive lock held for the process's life, naming its holder to a second one.

A coordinator, worker or validator keeps its node key, pinned coordinator id, weights and (for the
coordinator) ledger, trainer directory and origin store in its data dir. Two processes on one data dir
join as one node id, share one weights folder, or run two trainers on one train dir; nothing good comes
of it. :func:`hold_data_dir` takes an ``flock`` on ``<data dir>/node.lock`` (released by the kernel when
the process ends, however it ends, so a crash never leaves a stale lock) and writes who holds it; a second
process gets a :class:`~protocol.errors.StartupError` naming the holder's role, PID, host and start time.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from protocol.errors import StartupError

LOCK_FILE_NAME = "node.lock"


class DataDirLock:
    """An exclusive lock on a data dir, held until :meth:`release` or the process's end."""

    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor of the open file releases the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def describe_holder(raw: str) -> str:
    """The holder recorded in a lock file, in words (what is there may be partial: it is only a hint)."""
    try:
        holder = json.loads(raw)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["started_at"])))
        return f"{holder['role']} (pid {int(holder['pid'])} on {holder['host']}, since {started})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def hold_lock_file(path: Path, role: str, what: str, fix: str) -> DataDirLock:
    """Lock ``path`` (created if missing) for this process as ``role``; a StartupError naming the holder if taken.

    ``what`` names the locked thing in the error ("the data dir runs/demo"), ``fix`` says what to do.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by children (PEP 446)
    except OSError as exc:
        raise StartupError(f"cannot create the lock file {path}: {exc.strerror}", fix) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
        os.close(fd)
        raise StartupError(f"{what} is in use by {holder}", fix) from None
    record = {"role": role, "pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return DataDirLock(path.parent, fd)


def hold_data_dir(data_dir: Path, role: str) -> DataDirLock:
    """Lock ``data_dir`` for this process as ``role`` (e.g. ``prime-worker``); a StartupError if another holds it."""
    return hold_lock_file(
        data_dir / LOCK_FILE_NAME,
        role,
        f"the data dir {data_dir}",
        "stop that process first, or give this one a data dir of its own (--data-dir)",
    )
