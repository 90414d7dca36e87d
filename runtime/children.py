"""Child processes of a role, supervised in one way: bounded logs, death with the parent, stop by PID.

The coordinator starts the trainer service (torchrun), the built-in validator and, in the demo,
a whole local network. Each is a :class:`Child`: its stdout and stderr go through a pipe into
a :class:`RotatingLog` (``<name>.log``, moved to ``<name>.log.1`` when it passes
``max_bytes``, ``backups`` old files kept), so a run of thousands of steps keeps a bounded log
per node whatever the child prints, vLLM's and torch's own output included. The child gets a
signal from the kernel if the process that started it dies (:func:`runtime.lifetime.child_preexec`),
and :meth:`Child.stop` ends it by its PID (SIGTERM, then SIGKILL after a timeout:
:func:`stop_processes`, which also stops plain ``Popen`` processes); nothing is ever signalled by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from protocol.errors import ChildExitedError
from runtime.lifetime import child_preexec

_PUMP_CHUNK = 1 << 16


@dataclass(frozen=True)
class LogLimits:
    """How large one node's log may grow: ``max_bytes`` per file, ``backups`` older files kept."""

    max_bytes: int = 16 << 20
    backups: int = 3


class RotatingLog:
    """Bytes appended to ``path``; past ``max_bytes`` it becomes ``path.1`` (``.1`` -> ``.2`` ...)."""

    def __init__(self, path: Path, limits: LogLimits = LogLimits()) -> None:
        if limits.max_bytes < 1 or limits.backups < 0:
            raise ValueError(f"log limits must be positive, got {limits}")
        self.path = path
        self.limits = limits
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        if self._size and self._size + len(data) > self.limits.max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        if self.limits.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for index in range(self.limits.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self.path.open("ab")
        self._size = 0

    def close(self) -> None:
        self._file.close()


def sharing_cores_env() -> dict[str, str]:
    """This process's environment for a child that shares the machine's cores with others (the trainer's ranks,
    the local network's nodes): one OpenMP thread, unless ``OMP_NUM_THREADS`` is set. Several processes each
    computing with every core slow one another down more than their threads speed each up."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def log_tail(path: Path, num_chars: int) -> str:
    """The last ``num_chars`` characters of a (rotated) log: the current file, topped up from ``.1``."""
    text = path.read_text(errors="replace") if path.exists() else ""
    previous = path.with_name(f"{path.name}.1")
    if len(text) < num_chars and previous.exists():
        text = previous.read_text(errors="replace") + text
    return text[-num_chars:]


class Child:
    """One supervised child process; :meth:`start` spawns it, :meth:`check` raises once it has exited."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cpus: Sequence[int] = (),
        death_signal: int = signal.SIGKILL,
        own_group: bool = False,
        limits: LogLimits = LogLimits(),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cpus = list(cpus)
        self.death_signal = death_signal
        self.own_group = own_group
        """Start the child in a session of its own and signal the whole group (torchrun and its ranks)."""
        self.limits = limits
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        """Spawn the child (from a thread that lives as long as it should: the death signal follows it)."""
        log = RotatingLog(self.log_path, self.limits)
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=self.own_group,
            preexec_fn=child_preexec(self.cpus, self.death_signal),
        )
        stream = self.proc.stdout
        assert stream is not None
        self._pump = threading.Thread(target=_pump, args=(stream, log), name=f"log-{self.name}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self, num_chars: int = 2000) -> str:
        """The end of the child's log, everything it printed before it exited included."""
        if self._pump is not None and not self.running:
            self._pump.join(timeout=5)
        return log_tail(self.log_path, num_chars)

    def check(self, what: str | None = None, fix: str = "") -> None:
        """Once exited, raise :class:`ChildExitedError`: ``what`` exited with code N, the log, ``fix``, its tail."""
        code = self.returncode
        if code is None:
            return
        label = what or self.name
        advice = f" {fix}" if fix else ""
        raise ChildExitedError(f"{label} exited with code {code} (log {self.log_path}).{advice}\n{self.tail()}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (its group with ``own_group``), then SIGKILL if it has not exited within ``timeout_s``."""
        stop_children([self], timeout_s)

    def _finish(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)  # longer only while a grandchild still holds the pipe open


def stop_children(children: Sequence[Child], timeout_s: float = 20.0) -> None:
    """Stop every running child: SIGTERM all, wait up to ``timeout_s``, SIGKILL those still running."""
    started = [child for child in children if child.proc is not None]
    leaders = {child.pid for child in started if child.own_group}
    procs = [child.proc for child in started if child.proc is not None]
    stop_processes(procs, timeout_s, lambda proc, sig: send_signal(proc, sig, group=proc.pid in leaders))
    for child in started:
        child._finish()


def send_signal(proc: subprocess.Popen[bytes], sig: int, group: bool = False) -> None:
    """``sig`` to ``proc`` (to its whole process group with ``group``); nothing when it is already gone."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)


def stop_processes(
    procs: Iterable[subprocess.Popen[bytes]],
    timeout_s: float = 30.0,
    send: Callable[[subprocess.Popen[bytes], int], None] = send_signal,
) -> None:
    """SIGTERM every still-running process, wait, then SIGKILL the ones that did not exit in time."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            send(proc, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            send(proc, signal.SIGKILL)
            proc.wait()


def _pump(stream: IO[bytes], log: RotatingLog) -> None:
    """Copy the child's output into its log until every writer has closed the pipe."""
    try:
        while chunk := os.read(stream.fileno(), _PUMP_CHUNK):
            log.write(chunk)
    except OSError:
        pass
    finally:
        log.close()
        stream.close()
