"""A new user's first `make demo`, cold: a fresh copy of the repository, nothing cached, first try.

The repository's tracked files are copied into an empty directory (what a clone gives), the
built-in models are built there from nothing (PRIME_BUILTIN_DIR points at an empty directory,
so the RL start checkpoint is trained on the spot) and vLLM starts with an empty cache. The
demo command then runs in reduced form, `prime-coordinator start -c configs/demo.toml` with
few steps, and must finish with exit code 0 and the reward curve: a slow cold start of the
vLLM worker while newer policy versions are published must not break the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runtime.ports import free_port
from tests.support.network import BIN, REPO_ROOT

pytestmark = pytest.mark.slow
NUM_STEPS = 3
TIMEOUT_S = 2400  # building the start checkpoint (120 SFT steps) is much of it; far less on an idle machine


def fresh_copy(dest: Path) -> Path:
    """The repository's tracked files (as they are in the working tree) copied under ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_the_demo_completes_on_the_first_cold_try(tmp_path: Path) -> None:
    repo = fresh_copy(tmp_path / "prime-network")
    assert not (repo / "runs").exists()
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "PRIME_BUILTIN_DIR": str(tmp_path / "builtin"),
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    argv = [str(BIN / "prime-coordinator"), "start", "-c", "configs/demo.toml", "--port", str(free_port())]
    argv += ["--set", f"orchestrator.num_steps={NUM_STEPS}", "--set", "orchestrator.groups_per_step=2"]
    log = tmp_path / "demo.log"
    with log.open("wb") as err:
        try:
            done = subprocess.run(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=err, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not finish in time:\n{log.read_text(errors='replace')[-4000:]}")
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, log.read_text(errors="replace")[-4000:]
    assert "step  reward" in output, output[-2000:]
    assert (tmp_path / "builtin" / "small-qwen3-sort-start" / "config.json").is_file()
    last = next(line for line in reversed(output.splitlines()) if line.strip().startswith(f"{NUM_STEPS} "))
    assert 0.0 <= float(last.split()[-1]) <= 1.0, last  # the last policy's held-out accuracy, on screen
