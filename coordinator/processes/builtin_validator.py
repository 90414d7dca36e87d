"""The built-in validator of single-machine runs: a `prime-validator run` child of `prime-coordinator start`.

With ``validation.builtin_enabled``, the coordinator creates (or loads) a validator key in
``builtin-validator/`` under the run's data dir and approves it like an operator-listed key
(:func:`approve_builtin_validator`), then starts ``prime-validator run`` against its own API
once the socket is bound (:class:`BuiltinValidator`); the child pins the coordinator's id,
keeps its downloaded policies under that directory, and logs (JSON lines) to
``builtin-validator.log`` in the data dir. It is stopped by its PID when the coordinator
stops (also when the coordinator ends on SIGTERM), and on Linux it also receives SIGTERM if the
coordinator dies without cleaning up (SIGKILL).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from coordinator.config import CoordinatorConfig
from protocol.identity import load_or_create_identity
from runtime.children import Child

log = logging.getLogger("coordinator.validator")


def builtin_validator_dir(config: CoordinatorConfig) -> Path:
    return config.data_dir / "builtin-validator"


def builtin_validator_log(config: CoordinatorConfig) -> Path:
    return config.data_dir / "builtin-validator.log"


def approve_builtin_validator(config: CoordinatorConfig) -> CoordinatorConfig:
    """The config with the built-in validator's key (created first if needed) approved; unchanged when disabled."""
    if not config.validation.builtin_enabled:
        return config
    node_id = load_or_create_identity(builtin_validator_dir(config)).node_id
    if node_id in config.trust.approved_validators:
        return config
    trust = config.trust.model_copy(update={"approved_validators": [*config.trust.approved_validators, node_id]})
    return config.model_copy(update={"trust": trust})


def local_url(host: str, port: int) -> str:
    """The URL a process on this machine reaches an API bound to ``host`` at."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BuiltinValidator:
    """The child process; :meth:`start` spawns it, :meth:`stop` ends it (by PID) and waits."""

    def __init__(self, config: CoordinatorConfig, coordinator_id: str) -> None:
        self.config = config
        self.coordinator_id = coordinator_id
        self.child: Child | None = None

    def start(self, url: str) -> None:
        script = Path(sys.executable).parent / "prime-validator"
        command = [str(script), "run", "--coordinator", url, "--data-dir", str(builtin_validator_dir(self.config))]
        command += ["--set", f"coordinator_id={self.coordinator_id}", "--json-logs"]
        log_path = builtin_validator_log(self.config)
        self.child = Child(
            "builtin-validator",
            command,
            log_path,
            env=dict(os.environ),
            death_signal=signal.SIGTERM,
            limits=self.config.child_logs.limits(),
        )
        self.child.start()
        log.info("built-in validator started (pid %d), logging to %s", self.child.pid, log_path)
        # uvicorn re-raises a SIGTERM it caught once it has shut down; under the default handler that
        # ends this process before any `finally` runs, so stop the child first, then die of it as before.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._stop_then_die)

    def _stop_then_die(self, signum: int, _frame: FrameType | None) -> None:
        self.stop()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    def stop(self) -> None:
        if self.child is None:
            return
        self.child.stop(timeout_s=20)
        log.info("built-in validator (pid %d) stopped with exit code %s", self.child.pid, self.child.returncode)
        self.child = None
