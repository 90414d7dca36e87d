"""A run whose start checkpoint is a hub id, through the real `prime-coordinator start`, offline from a filled cache.

The cache's files are symlinks into its blobs: what the origin publishes as v0 must be the model's bytes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import pytest
import tomli_w

from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.hub_cache import fill_hub_cache
from trainer.resolve import resolve_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_coordinator_publishes_a_hub_model_from_the_cache_offline(tmp_path: Path) -> None:
    checkpoint = resolve_model_path("builtin:tiny-qwen2")  # a real tokenizer for the run's built-in task
    fill_hub_cache(tmp_path / "hub", "test-org/tiny-policy", checkpoint)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "hub",
        "data_dir": str(tmp_path / "run"),
        "api": {"host": "127.0.0.1", "port": port},
        "policy": {"start_checkpoint": "test-org/tiny-policy"},
        "validation": {"builtin_enabled": False},
    }
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(config))
    env = {"PYTHONPATH": str(REPO_ROOT), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    coordinator = CoordinatorProcess(path, tmp_path / "coordinator.log", env)
    try:
        coordinator.start(url, timeout_s=120)
        manifest = httpx.get(f"{url}/v1/policy-versions/latest", timeout=5).json()["manifest"]
    finally:
        coordinator.stop()
    published = {entry["path"]: entry["size_bytes"] for entry in manifest["files"]}
    expected = {p.name: p.stat().st_size for p in checkpoint.iterdir() if p.is_file()}
    assert published == expected
    stored = tmp_path / "run" / "policies" / "v0" / "files" / "model.safetensors"
    assert not os.path.islink(stored)
    digest = hashlib.sha256(stored.read_bytes()).hexdigest()
    assert digest == hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
