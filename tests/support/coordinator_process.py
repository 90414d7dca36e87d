"""Run `prime-coordinator start` as a child process: start it, wait until it answers, stop it by its PID.

For programs that drive a real coordinator on 127.0.0.1 (integration tests, benchmarks, the
demo): the child's stderr goes to a log file, and only the process this object started is
ever signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from runtime.children import stop_processes


class CoordinatorProcess:
    def __init__(
        self, config_path: Path, log_path: Path, env: Mapping[str, str] | None = None, stdout_path: Path | None = None
    ) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.stdout_path = stdout_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self, url: str, extra_args: tuple[str, ...] = (), timeout_s: float = 60.0) -> None:
        """Start the coordinator and return once ``url``/healthz answers 200."""
        script = Path(sys.executable).parent / "prime-coordinator"
        command = [str(script), "start", "-c", str(self.config_path), *extra_args]
        with self.log_path.open("ab") as log, (self.stdout_path or Path(os.devnull)).open("ab") as out:
            self.proc = subprocess.Popen(command, stderr=log, stdout=out if self.stdout_path else None, env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited during start-up:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"coordinator did not answer within {timeout_s} s:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the crash that nothing can clean up after."""
        os.kill(self.pid, signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (graceful), then SIGKILL if it does not exit in time; no-op when not running."""
        if self.proc is not None:
            stop_processes([self.proc], timeout_s)
