"""Bench-only virtual environments for the reference implementations a bench measures against.

A reference (TRL, the original shardcast) is installed on first use into its own venv beside the
repository, never into ``.venv``: its dependencies would move the project's, or its import name
would clash with ours. A venv whose probe passes is reused as it is.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def reference_venv(venv: Path, module: str, version: str, packages: Sequence[str], log: Callable[[str], None]) -> Path:
    """The Python of ``venv`` once ``import module`` there gives ``version``; creates the venv and installs
    ``packages`` into it when not. The probe runs inside ``venv``: from the repository's root an import could
    find a package of ours by the same name."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", f"import {module}; assert {module}.__version__ == '{version}'"]
    if python.exists() and subprocess.run(probe, capture_output=True, cwd=venv).returncode == 0:
        return python
    log(f"creating {venv} with {module}=={version} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True, stdout=sys.stderr)
    return python
