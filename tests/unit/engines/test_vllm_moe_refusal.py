"""vLLM on the CPU refuses a mixture-of-experts checkpoint at start, with the fix, before vLLM is even started."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.vllm import VllmEngine, refuse_cpu_moe
from protocol.errors import StartupError
from tests.support.tiny_model import TinyModelSpec, save_tiny_model


def test_a_cpu_vllm_engine_refuses_qwen3_moe_and_names_the_fix(tmp_path: Path) -> None:
    moe = save_tiny_model(tmp_path / "moe", spec=TinyModelSpec(architecture="qwen3_moe", num_hidden_layers=1))
    with pytest.raises(StartupError, match="mixture-of-experts") as refused:
        VllmEngine(moe, device="cpu")
    assert "\n" not in str(refused.value) and "--engine hf" in str(refused.value)


@pytest.mark.parametrize("architecture", ["qwen2_tied", "qwen3", "llama3"])
def test_dense_checkpoints_are_not_refused(architecture: str, tmp_path: Path) -> None:
    spec = TinyModelSpec(architecture=architecture, num_hidden_layers=1)  # type: ignore[arg-type]
    refuse_cpu_moe(save_tiny_model(tmp_path / architecture, spec=spec))
