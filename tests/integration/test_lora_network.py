"""A LoRA run end to end through the real network: `prime-coordinator start` with `[orchestrator.trainer.lora]`.

The run spec pins the base (v0) by hash; a 2-rank torchrun trainer trains PEFT adapters under FSDP2 and
each step is published as an adapter version (a few KB beside the base's MB); a vLLM worker starts its
engine on the base and loads each version's adapter in place; the validator prefills with the
base and the submission's adapter, and accepts every honest submission. The coordinator is SIGKILLed
after the first step and the same command resumes the run (the trainer from its adapters-only
checkpoint, the worker on the base it checks again) with the steps recorded before the crash
unchanged. The run ends with the merged model as its final policy and the adapter beside it, the two
computing the same logits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest
import tomli_w
import torch

from runtime.ports import free_port
from shardcast.format.manifest import checkpoint_digest
from tests.integration.test_orchestrator_network import (
    NUM_STEPS,
    finish,
    metric,
    start,
    steps_by_state,
    wait_for,
    write_config,
)
from tests.support.network import ledger_rows
from trainer.resolve import resolve_model_path

pytestmark = pytest.mark.slow

LORA = {"enabled": True, "rank": 4, "alpha": 8.0}
ENGINES = ("vllm",)
"""The HF worker's side of a LoRA run: tests/integration/test_lora_runs_network.py."""


def version_bytes(root: Path, version: int) -> int:
    manifest = json.loads((root / "run" / "policies" / f"v{version}" / "manifest.json").read_text())
    return int(manifest["manifest"]["total_size_bytes"])


def test_a_lora_run_trains_publishes_adapters_and_ends_with_the_merged_model(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path, port, trainer={"lora": LORA, "optimizer": {"lr": 1e-3}})
    settings = tomllib.loads(config.read_text())
    settings["local_network"]["engines"] = list(ENGINES)
    config.write_text(tomli_w.dumps(settings))
    coordinator = start(tmp_path, config, url, "coordinator")
    spec = httpx.get(f"{url}/v1/run-spec", timeout=5).json()["spec"]
    base = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    assert spec["lora"] == {
        "v": 1,
        "base_hash": checkpoint_digest(base),
        "rank": 4,
        "alpha": 8.0,
        "target_modules": ["all-linear"],
    }
    try:
        wait_for(lambda: (metric(url, "prime_train_steps_done") or 0) >= 1, coordinator, timeout_s=600)
        before = steps_by_state(tmp_path, "'recorded', 'trained', 'published'")
        coordinator.kill()
    finally:
        coordinator.stop()
    coordinator = start(tmp_path, config, url, "second")
    wait_for(lambda: coordinator.proc is not None and coordinator.proc.poll() is not None, coordinator, 900)
    assert finish(coordinator, 10) == 0, coordinator.log_path.read_text()[-4000:]
    stdout = (tmp_path / "second.out").read_text()
    assert "resuming the RL loop" in coordinator.log_path.read_text()
    published = steps_by_state(tmp_path, "'published'")
    assert sorted(published) == list(range(1, NUM_STEPS + 1))
    for step, submission_ids in before.items():
        assert published[step] == submission_ids, f"step {step} was recorded with {submission_ids} before the crash"

    # every version after the base is an adapter, a small fraction of the base's bytes; the base stays published
    store = tmp_path / "run" / "policies"
    assert (store / "v0" / "manifest.json").is_file()
    for version in range(1, NUM_STEPS + 1):
        manifest = json.loads((store / f"v{version}" / "manifest.json").read_text())["manifest"]
        files = manifest["result_files"] if manifest.get("kind") == "patch" else manifest["files"]
        assert sorted(f["path"] for f in files) == ["adapter_config.json", "adapter_model.safetensors"]
        assert version_bytes(tmp_path, version) * 20 < version_bytes(tmp_path, 0)
        assert manifest.get("kind", "full") == "full" or manifest["base_version"] == version - 1 >= 1
        assert manifest["served_on"] == 0  # origins and relays keep the base as long as they keep the adapter
    # every honest submission accepted, on the base (v0) and on adapters
    rows = ledger_rows(tmp_path, "SELECT status, policy_version, body_json FROM submissions")
    verdicts = [(status, version, json.loads(body)["engine"]) for status, version, body in rows]
    assert verdicts and all(status == "accepted" for status, _, _ in verdicts if status != "pending"), verdicts
    assert {engine for status, version, engine in verdicts if status == "accepted" and version >= 1} == set(ENGINES)
    for engine in ENGINES:
        logs = list((tmp_path / "run").rglob(f"worker-{engine}.log"))
        assert logs and logs[0].read_text(errors="replace").count("LoRA run (rank 4)") == 2, engine  # both starts

    # the result: the merged model, and the adapter, which PEFT loads on the base to the same logits
    final, adapter = tmp_path / "run" / "final-policy", tmp_path / "run" / "final-adapter"
    assert "final LoRA adapter" in stdout and (adapter / "adapter_model.safetensors").is_file()
    ids = torch.tensor([[5, 17, 30, 2, 9, 44]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)(ids).logits
        on_base = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
        torch.testing.assert_close(on_base(ids).logits, merged, atol=1e-4, rtol=1e-4)
    evaluated = subprocess.run(
        [str(Path(sys.executable).parent / "prime-trainer"), "eval", "--model", str(adapter)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
