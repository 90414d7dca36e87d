"""The built-in start bench runs end to end on its quick recipe and prints its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_quick_bench_builds_a_start_and_measures_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.builtin_start", "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)["summary"]
    assert summary["build_s"] > 0 and 0.0 <= summary["accuracy"] <= 1.0 and 0.0 <= summary["stop_fraction"] <= 1.0
    assert isinstance(summary["in_partial_range"], bool)
