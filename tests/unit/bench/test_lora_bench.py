"""The LoRA bench: sizes from shapes, bytes per version from manifests, the gain ratio and its guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lora_bench import (
    QWEN3_SHAPES,
    bytes_figures,
    learning_summary,
    lora_params,
    model_params,
    parse_args,
    size_table,
    version_sizes,
)


def test_qwen3_8b_weights_and_rank16_adapter_in_bf16() -> None:
    sizes = size_table()["Qwen3-8B"]
    assert model_params(QWEN3_SHAPES["Qwen3-8B"]) == 8_190_735_360
    assert sizes["full_bytes_bf16"] == 16_381_470_720  # about 16.4 GB
    # 36 layers x 16 x (q 4096+4096, k and v 4096+1024 each, o 4096+4096, gate and up 4096+12288, down 12288+4096)
    assert sizes["rank16_adapter_bytes_bf16"] == 36 * 16 * 75_776 * 2 == 87_293_952  # about 87 MB
    assert sizes["rank64_adapter_bytes_bf16"] == 4 * sizes["rank16_adapter_bytes_bf16"]


def test_qwen3_32b_sizes_and_a_partial_module_list() -> None:
    shape = QWEN3_SHAPES["Qwen3-32B"]
    assert 32.7e9 < model_params(shape) < 32.8e9
    assert size_table()["Qwen3-32B"]["rank16_adapter_bytes_bf16"] == 268_435_456
    assert lora_params(shape, 8, ("q_proj", "v_proj")) == 64 * 8 * ((5120 + 8192) + (5120 + 1024))


def _manifest(store: Path, version: int, total: int, result: int | None = None) -> None:
    manifest: dict[str, object] = {"total_size_bytes": total}
    if result is not None:
        manifest |= {"kind": "patch", "result_files": [{"path": "adapter_model.safetensors", "size_bytes": result}]}
    (store / f"v{version}").mkdir(parents=True)
    (store / f"v{version}" / "manifest.json").write_text(json.dumps({"manifest": manifest}))


def test_bytes_per_version_from_the_origin_store(tmp_path: Path) -> None:
    lora, full = tmp_path / "lora", tmp_path / "full"
    for version, total, result in ((0, 1000, None), (1, 100, None), (2, 40, 100), (3, 60, 100), (10, 10, 100)):
        _manifest(lora / "policies", version, total, result)
    _manifest(full / "policies", 0, 1000)
    _manifest(full / "policies", 1, 300, 1000)
    lora_versions = version_sizes(lora)
    assert [v["version"] for v in lora_versions] == [0, 1, 2, 3, 10]
    figures = bytes_figures(lora_versions, version_sizes(full))
    assert (figures["adapter_bytes"], figures["patch_bytes"], figures["full_bytes"]) == (100, 36.7, 1000)
    assert figures["full_run_patch_bytes"] == 300
    alone = bytes_figures(lora_versions[:2], None)
    assert (alone["patch_bytes"], alone["full_bytes"]) == (None, 1000)


def test_gain_ratio_and_its_guard() -> None:
    seed = {"accuracy_before": 0.3, "full_accuracy_after": 0.7, "lora_accuracy_after": 0.66}
    figures = learning_summary([{**seed, "full_gain": 0.4, "lora_gain": 0.36}])
    assert figures["lora_gain_over_full"] == 0.9 and "lora_gain_over_full_null_reason" not in figures
    figures = learning_summary([{**seed, "full_gain": 0.0, "lora_gain": 0.1}])
    assert figures["lora_gain_over_full"] is None and "not positive" in figures["lora_gain_over_full_null_reason"]


def test_lora_lr_defaults_to_six_times_the_full_lr() -> None:
    args = parse_args(["--quick", "--lr", "3e-4"])
    assert args.lora_lr == pytest.approx(1.8e-3) and (args.seeds, args.steps, args.engines) == (1, 10, ["vllm"])
    assert parse_args(["--lora-lr", "1e-3"]).lora_lr == 1e-3
