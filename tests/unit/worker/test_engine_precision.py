"""A worker's engine computes in the run's precision, the dtype validators recompute in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from protocol.errors import ConfigError
from tests.support.tiny_model import save_tiny_qwen2
from worker.devices import DeviceInfo
from worker.join import create_engine

CPU = DeviceInfo(device="cpu", name="cpu", memory_bytes=0)


def test_the_hf_engine_takes_the_runs_precision(tmp_path: Path) -> None:
    checkpoint = save_tiny_qwen2(tmp_path / "tiny", seed=0)
    threads = torch.get_num_threads()
    try:
        for precision, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
            engine = create_engine("hf", checkpoint, CPU, 4, precision)
            assert engine.model.dtype == dtype  # type: ignore[attr-defined]
            assert all(p.dtype == dtype for p in engine.model.parameters())  # type: ignore[attr-defined]
            engine.close()
        with pytest.raises(ConfigError, match="'int8' is not one the HF engine runs in"):
            create_engine("hf", checkpoint, CPU, 4, "int8")
    finally:
        torch.set_num_threads(threads)
