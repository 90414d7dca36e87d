"""Debian's HAProxy with the project's deploy/haproxy.cfg, in front of a coordinator and two API replicas."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.requirements import missing

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"
INSTALL_HINT = "apt-get install haproxy"


def require_haproxy() -> str:
    """The haproxy binary; a missing one skips the test, or fails it under CI=true."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        message = f"haproxy missing: {INSTALL_HINT}"
        missing(f"CI=true: {message}", message)
    return found


def start_haproxy(bind: str, coordinator: str, replicas: tuple[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """HAProxy in the foreground on ``bind`` (host:port), returned once it answers /healthz through a backend."""
    env = {
        **os.environ,
        "PRIME_LB_BIND": bind,
        "PRIME_COORDINATOR": coordinator,
        "PRIME_REPLICA1": replicas[0],
        "PRIME_REPLICA2": replicas[1],
    }
    with log_path.open("ab") as log:
        proc = subprocess.Popen([require_haproxy(), "-db", "-f", str(CONFIG)], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"haproxy exited:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://{bind}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"haproxy did not answer within 30 s:\n{log_path.read_text()[-2000:]}")
