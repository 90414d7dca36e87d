"""The run's precision: resolved from `auto`, signed into the run spec, followed by the trainer's exports."""

from __future__ import annotations

import pytest
import torch

from coordinator.config import CoordinatorConfig
from coordinator.ledger.run_spec import check_precision, run_precision, run_spec, trainer_section
from protocol.errors import ConfigError
from protocol.schemas import RunSpec
from runtime.config import load_config


def config_with(**values: object) -> CoordinatorConfig:
    return load_config(CoordinatorConfig, None, values)


def test_auto_is_bf16_with_a_cuda_gpu_and_float32_without() -> None:
    expected = "bfloat16" if torch.cuda.is_available() else "float32"
    assert run_precision(config_with()) == expected
    assert run_precision(config_with(precision="bfloat16")) == "bfloat16"
    assert run_precision(config_with(precision="float32")) == "float32"


def test_the_signed_run_spec_carries_the_precision() -> None:
    spec = run_spec(config_with(precision="bfloat16"))
    assert spec.precision == "bfloat16"
    assert RunSpec.model_validate_json(spec.model_dump_json()).precision == "bfloat16"
    with pytest.raises(ValueError, match="precision"):
        RunSpec.model_validate({**spec.model_dump(mode="json"), "precision": "int8"})


def test_a_precision_without_calibrations_is_refused_with_the_command_that_makes_them() -> None:
    assert check_precision(config_with(precision="bfloat16")) == "bfloat16"
    with pytest.raises(ConfigError) as refused:
        check_precision(config_with(precision="float16"))
    message = refused.value.message
    assert message.startswith("precision float16: validators have no TOPLOC calibration")
    assert "python -m bench.toploc_calibrate --dtype float16 --engine vllm --write" in message


def test_the_trainer_keeps_float32_masters_and_publishes_in_the_runs_precision() -> None:
    section = trainer_section(config_with(precision="bfloat16"), "/models/start")
    assert section.model == "/models/start"
    assert section.dtype == "float32", "master weights"
    assert section.checkpoint.export_dtype == "bfloat16"
    assert section.parallel.param_dtype == ("bfloat16" if torch.cuda.is_available() else None)
    assert trainer_section(config_with(precision="float32"), "m").checkpoint.export_dtype == "float32"


def test_an_explicit_export_dtype_or_param_dtype_is_kept() -> None:
    config = config_with(
        precision="float32",
        **{
            "orchestrator.trainer.checkpoint.export_dtype": "bfloat16",
            "orchestrator.trainer.parallel.param_dtype": "float32",
        },
    )
    section = trainer_section(config, "m")
    assert section.checkpoint.export_dtype == "bfloat16", "a float32 run may publish bf16 (smaller patches)"
    assert trainer_section(config.model_copy(update={"precision": "bfloat16"}), "m").parallel.param_dtype == "float32"
