"""Child processes that cannot outlive their parent: Linux ``PR_SET_PDEATHSIG``.

The coordinator starts the trainer (torchrun and its ranks) and, in the demo, a local
network. If the coordinator is SIGKILLed nothing can clean up after it, so each child asks
the kernel for a signal when its parent dies: :func:`die_with_parent` in the child itself, or
:func:`child_preexec` as ``subprocess.Popen(preexec_fn=...)``. The signal follows
the parent *thread* that forked the child, so start such children from a thread that lives as
long as they should. On other systems these are no-ops (the children then need stopping by PID).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Ask for ``sig`` when the parent dies; False when not supported. Exits at once if the parent is
    already gone (it died before the request was made)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True


def parent_of(pid: int) -> int | None:
    """The parent PID of ``pid`` (from /proc), or None when unknown."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def child_preexec(cpus: Sequence[int] = (), sig: int = signal.SIGKILL) -> Callable[[], None]:
    """``preexec_fn`` for Popen: the child gets ``sig`` when the process that started it dies, and runs
    on ``cpus`` only when given (as inference and training sit on separate devices in a real deployment)."""

    def preexec() -> None:
        die_with_parent(sig)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return preexec
