"""The trainer on every architecture of the matrix: FSDP2 on 2 ranks (torchrun, gloo on CPU) as one process.

Per architecture (Qwen3-MoE's experts included, sharded with their decoder block): two RL steps
with activation checkpointing on 2 ranks give the losses, gradient norms and weights of the same
steps in one unsharded process, and the exported policy is in the checkpoint layout the engines
read (the start's tensor names and shapes: per-expert MoE tensors, no tied head): the HF engine
reloads it in place and draws what a fresh load of it draws. (The vLLM matrix test reloads it too.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engines.hf import HFEngine
from tests.integration.architectures.conftest import ledger_task, sample_tasks
from tests.integration.architectures.train_probe import train_and_export
from tests.support.adversary import generation_request
from tests.support.tiny_model import ARCHITECTURES

pytestmark = pytest.mark.slow


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_fsdp2_steps_match_one_process_and_export_reloads(
    architecture: str, trainer_starts: dict[str, Path], trained_policies: dict[str, Path], tmp_path: Path
) -> None:
    start, trained = trainer_starts[architecture], trained_policies[architecture]
    sharded = json.loads((trained / "metrics.json").read_text())
    assert sharded["world_size"] == 2
    single = train_and_export(start, tmp_path)
    for got, want in zip(sharded["steps"], single, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        assert got["num_micro_batches"] == want["num_micro_batches"] > 1

    exported, original, unsharded = _weights(trained / "policy"), _weights(start), _weights(tmp_path / "policy")
    assert {n: t.shape for n, t in exported.items()} == {n: t.shape for n, t in original.items()}
    changed = [name for name, tensor in exported.items() if not torch.equal(tensor, original[name])]
    assert changed == sorted(exported), "every tensor takes part in training"
    # Adam divides by sqrt(v): where a gradient is near zero, the sharded reduction's other summation order moves
    # an element by a few 1e-6 (seen: 3.3e-6 on 1 of 8192). An update is up to lr = 1e-3 per element, so 1e-5
    # still catches any real difference between the sharded and the single-process step.
    for name, tensor in unsharded.items():
        torch.testing.assert_close(exported[name], tensor, atol=1e-5, rtol=1e-4)

    requests = [generation_request(t, i) for i, t in enumerate(sample_tasks(ledger_task()))]
    engine = HFEngine(start, max_batch_size=8)
    engine.load_weights(trained / "policy")
    fresh = HFEngine(trained / "policy", max_batch_size=8).generate(requests)
    assert [r.completion_ids for r in engine.generate(requests)] == [r.completion_ids for r in fresh]
