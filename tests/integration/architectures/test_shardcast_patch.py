"""SHARDCAST value patches between two policy versions of every architecture of the matrix.

Per architecture: the patch from one checkpoint to the next rebuilds the next one byte for byte
(a tied checkpoint without ``lm_head.weight``, Qwen3-MoE's per-expert tensors), and an engine
reloaded from the patched directory draws what the next version draws.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.hf import HFEngine
from shardcast.format.patch import apply_patch, encode_patch
from tests.integration.architectures.conftest import ledger_task, sample_tasks
from tests.support.adversary import generation_request
from tests.support.tiny_model import ARCHITECTURES

MAX_OUTPUT_BYTES = 1 << 30


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_patched_version_is_the_next_version(
    architecture: str, matrix_models: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    base, new = matrix_models[architecture]
    encode_patch(base, new, tmp_path / "v1.patch")
    apply_patch(base, tmp_path / "v1.patch", tmp_path / "patched", MAX_OUTPUT_BYTES)
    patched = tmp_path / "patched"
    assert (patched / "model.safetensors").read_bytes() == (new / "model.safetensors").read_bytes()

    requests = [generation_request(t, i) for i, t in enumerate(sample_tasks(ledger_task()))]
    engine = HFEngine(base, max_batch_size=8)
    engine.load_weights(patched)
    want = HFEngine(new, max_batch_size=8).generate(requests)
    assert [r.completion_ids for r in engine.generate(requests)] == [r.completion_ids for r in want]
