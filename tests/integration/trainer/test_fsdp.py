"""FSDP2 under torchrun (2 ranks, gloo on CPU) against one unsharded process; resume on one rank and on two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.integration.trainer.fsdp_probe import LOSS, contract_probe, probe_batch, probe_section, run_probe

PROBE = Path(__file__).with_name("fsdp_probe.py")


def _weights(policy: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(policy / "model.safetensors"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.resolve import resolve_model_path

    return resolve_model_path("builtin:tiny-qwen2", tmp_path_factory.mktemp("builtin"))


def torchrun_probe(model_dir: Path, out_dir: Path, *flags: str) -> None:
    """The probe on two FSDP2 ranks under torchrun, writing into ``out_dir``; fails the test if it fails."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROBE)]
    done = subprocess.run(
        [*command, str(model_dir), str(out_dir), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-12000:]  # room for a rank's traceback before torchrun's report


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_process_and_resume_on_one(model_dir: Path, tmp_path: Path) -> None:
    sharded_dir, single_dir = tmp_path / "fsdp2", tmp_path / "single"
    sharded_dir.mkdir()
    single_dir.mkdir()
    torchrun_probe(model_dir, sharded_dir, "--ac")
    sharded = json.loads((sharded_dir / "metrics.json").read_text())
    assert sharded["world_size"] == 2

    single = run_probe(model_dir, single_dir)
    for got, want in zip(sharded["steps"], single, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        assert got["entropy"] == pytest.approx(want["entropy"], rel=1e-5)
        assert got["num_micro_batches"] == want["num_micro_batches"] > 2
    sharded_weights, single_weights = _weights(sharded_dir / "policy"), _weights(single_dir / "policy")
    assert sharded_weights.keys() == single_weights.keys()
    for name, value in single_weights.items():
        torch.testing.assert_close(sharded_weights[name], value, atol=2e-6, rtol=1e-4)

    # The state saved by the two ranks after step 1 resumes in one process and reproduces step 2.
    from trainer.train import Trainer

    resumed = Trainer(probe_section(model_dir), num_steps=4)
    assert resumed.resume(sharded_dir / "ckpt")
    again = resumed.rl_step(probe_batch(resumed, 2), LOSS)
    assert again["loss"] == pytest.approx(sharded["steps"][1]["loss"], abs=1e-5)
    for name, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, sharded_weights[name], atol=2e-6, rtol=1e-4)
    # ... and on two ranks again (every rank takes part in loading what rank 0 read).
    torchrun_probe(model_dir, sharded_dir, "--resume")
    resumed_sharded = json.loads((sharded_dir / "resumed.json").read_text())
    assert resumed_sharded["loss"] == pytest.approx(sharded["steps"][1]["loss"], abs=1e-5)


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE (4 experts, top 2, in every layer) with the built-in tokenizer beside it."""
    from tests.support.tiny_model import TinyModelSpec, save_tiny_model
    from trainer.builtin import builtin_tokenizer
    from trainer.tokenizer import save_hf_tokenizer

    spec = TinyModelSpec(architecture="qwen3_moe", num_attention_heads=2, num_key_value_heads=1)
    start = save_tiny_model(tmp_path_factory.mktemp("moe"), seed=0, spec=spec)
    save_hf_tokenizer(builtin_tokenizer(), start, spec.max_position_embeddings)
    return start


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3_moe"])
def test_lora_under_two_fsdp_ranks_matches_one_process_and_resumes(
    architecture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """PEFT adapters sharded with the frozen base (Qwen3-MoE: its stacked experts and router adapted too): the same
    steps and adapter as one process; the adapter on the base serves what the merged export serves; the saved
    state (the adapters and their optimizer state alone) resumes exactly on two ranks."""
    from safetensors.torch import load_file

    from engines.adapters import WEIGHTS_FILE as ADAPTER_WEIGHTS_FILE
    from engines.hf import HFEngine
    from tests.integration.architectures.conftest import ledger_task, sample_tasks
    from tests.support.adversary import generation_request

    model_dir: Path = request.getfixturevalue("moe_model_dir" if architecture == "qwen3_moe" else "model_dir")

    sharded_dir, single_dir = tmp_path / "fsdp2", tmp_path / "single"
    sharded_dir.mkdir()
    single_dir.mkdir()
    torchrun_probe(model_dir, sharded_dir, "--ac", "--lora")
    sharded = json.loads((sharded_dir / "metrics.json").read_text())
    single = run_probe(model_dir, single_dir, lora=True)
    for got, want in zip(sharded["steps"], single, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4) and got["grad_norm"] > 0
    adapter = load_file(str(sharded_dir / "policy" / ADAPTER_WEIGHTS_FILE))
    reference = load_file(str(single_dir / "policy" / ADAPTER_WEIGHTS_FILE))
    assert adapter.keys() == reference.keys() and any(".lora_B." in name for name in adapter)
    for name, value in reference.items():
        torch.testing.assert_close(adapter[name], value, atol=2e-5, rtol=1e-3)  # lr 1e-2: sums in another order
    assert any(value.abs().max() > 0 for name, value in adapter.items() if ".lora_B." in name)  # it trained
    if architecture == "qwen3_moe":
        assert any(".mlp.experts." in name for name in adapter)
    requests = [generation_request(t, i) for i, t in enumerate(sample_tasks(ledger_task()))]
    on_base = HFEngine(model_dir, max_batch_size=8)
    on_base.load_adapter("run", sharded_dir / "policy")
    served = [r.completion_ids for r in on_base.generate([replace(r, adapter="run") for r in requests])]
    merged = HFEngine(sharded_dir / "merged", max_batch_size=8)
    assert served == [r.completion_ids for r in merged.generate(requests)]
    saved = torch.load(sharded_dir / "ckpt" / "step_1" / "trainer_state.pt", weights_only=False)
    assert saved["model"] and all("lora_" in name for name in saved["model"])  # the frozen base is not saved

    torchrun_probe(model_dir, sharded_dir, "--lora", "--resume")
    resumed = json.loads((sharded_dir / "resumed.json").read_text())
    assert resumed["loss"] == pytest.approx(sharded["steps"][1]["loss"], abs=1e-5)
    assert resumed["grad_norm"] == pytest.approx(sharded["steps"][1]["grad_norm"], rel=1e-4)


@pytest.mark.slow
def test_the_training_safety_contract_on_two_fsdp_ranks_matches_one_process_and_resumes(
    model_dir: Path, tmp_path: Path
) -> None:
    """Behaviour log-probabilities recomputed with a kept version's weights swapped into the sharded model, an update
    refused on every rank alike, a restore of an exported version into the shards, and a resume of all of it."""
    sharded_dir, single_dir = tmp_path / "fsdp2", tmp_path / "single"
    sharded_dir.mkdir()
    single_dir.mkdir()
    torchrun_probe(model_dir, sharded_dir, "--contract")
    sharded = json.loads((sharded_dir / "contract.json").read_text())["steps"]
    single = contract_probe(model_dir, single_dir)
    assert (
        [("tripped" in m) for m in sharded] == [("tripped" in m) for m in single] == [False, False, True, False, False]
    )
    for got, want in zip(sharded, single, strict=True):
        for key in ("loss", "grad_norm", "mismatch_kl"):
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert single[1]["mismatch_kl"] > 0  # a stale batch: scored under v0, trained from v1
    sharded_weights, single_weights = _weights(sharded_dir / "policy"), _weights(single_dir / "policy")
    for name, value in single_weights.items():  # Adam's first step after the restore is near lr * sign(gradient)
        torch.testing.assert_close(sharded_weights[name], value, atol=2e-5, rtol=1e-3)
    torchrun_probe(model_dir, sharded_dir, "--contract", "--resume")
    resumed = json.loads((sharded_dir / "contract_resumed.json").read_text())["steps"]
    assert resumed[-1]["loss"] == pytest.approx(sharded[-1]["loss"], abs=1e-6)
    for name, value in _weights(sharded_dir / "policy_resumed").items():
        assert torch.equal(value, sharded_weights[name]), name
