"""toploc.calibrations: the shipped calibrations, choosing one, and refusing a precision none covers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from protocol.errors import ConfigError
from toploc.calibrations import (
    CALIBRATION_DIR,
    GENERATING_ENGINES,
    THRESHOLD_KEYS,
    CalibrationKey,
    available,
    honest_worst,
    missing,
    require_calibrated,
    run_thresholds,
    run_toploc_config,
    thresholds,
    toploc_config,
)
from toploc.config import ToplocConfig

SHIPPED = {CalibrationKey(dtype, engine) for dtype in ("float32", "bfloat16") for engine in ("hf", "vllm")}


def test_every_precision_a_run_defaults_to_is_calibrated_for_every_engine() -> None:
    assert set(available()) >= SHIPPED
    for dtype in ("float32", "bfloat16"):
        require_calibrated(dtype)
        assert missing(dtype) == []


def test_each_shipped_calibration_is_what_its_bench_measured_for_that_key() -> None:
    for key in SHIPPED:
        data = json.loads((CALIBRATION_DIR / key.filename).read_text())
        summary = data["summary"]
        if key != CalibrationKey("float32", "hf"):  # the float32 HF data predates the bench's --dtype and --engine
            assert (summary["dtype"], summary["generating_engine"], summary["verifying_engine"]) == (
                key.dtype,
                key.generating_engine,
                key.verifying_engine,
            )
            assert summary["holdout_false_rejections"] == 0, key
        assert summary["attacks_all_detected"] is True, key
        assert thresholds(key) == {name: summary["thresholds"][name] for name in THRESHOLD_KEYS}


def test_bf16_thresholds_are_looser_than_float32_ones_where_bf16_rounds() -> None:
    for engine in GENERATING_ENGINES:
        bf16, fp32 = thresholds(CalibrationKey("bfloat16", engine)), thresholds(CalibrationKey("float32", engine))
        assert bf16["max_mant_err_mean"] > fp32["max_mant_err_mean"]
        assert bf16["logprob_tolerance"] > fp32["logprob_tolerance"]


def test_the_operators_explicit_settings_override_the_calibration() -> None:
    calibrated = toploc_config("bfloat16", "vllm")
    assert calibrated.max_mant_err_mean == thresholds(CalibrationKey("bfloat16", "vllm"))["max_mant_err_mean"]
    own = ToplocConfig(max_exp_mismatches=3)
    chosen = toploc_config("bfloat16", "vllm", own=own)
    assert chosen.max_exp_mismatches == 3
    assert chosen.max_mant_err_mean == calibrated.max_mant_err_mean, "fields the operator left alone stay calibrated"
    assert toploc_config("float32", "hf", own=ToplocConfig()) == toploc_config("float32", "hf")


def test_engines_get_their_own_calibration() -> None:
    for dtype in ("float32", "bfloat16"):
        for engine in GENERATING_ENGINES:
            assert toploc_config(dtype, engine).model_dump() == {
                **ToplocConfig().model_dump(),
                **thresholds(CalibrationKey(dtype, engine)),
            }


def test_a_missing_calibration_names_the_precision_and_the_command(tmp_path: Path) -> None:
    shutil.copy(CALIBRATION_DIR / "bfloat16_hf_hf.json", tmp_path / "bfloat16_hf_hf.json")
    (tmp_path / "notes.json").write_text("{}")
    (tmp_path / "float16_tpu_hf.json").write_text("{}")  # an engine nobody declares: not a calibration
    assert available(tmp_path) == [CalibrationKey("bfloat16", "hf")]
    assert missing("bfloat16", directory=tmp_path) == [CalibrationKey("bfloat16", "vllm")]
    with pytest.raises(ConfigError) as refused:
        require_calibrated("bfloat16", directory=tmp_path)
    message = refused.value.message
    assert "\n" not in message
    assert "precision bfloat16" in message and "vllm generating" in message
    assert "`python -m bench.toploc_calibrate --dtype bfloat16 --engine vllm --write`" in message
    assert "calibrated precisions: bfloat16" in message
    with pytest.raises(ConfigError, match=r"--dtype float16 --engine hf --write"):
        require_calibrated("float16")
    with pytest.raises(ConfigError, match=r"no TOPLOC calibration for float16 \(hf generating, hf verifying\)"):
        toploc_config("float16", "hf")


def test_a_run_audits_with_the_loosest_calibration_of_any_engine_a_worker_may_name() -> None:
    for dtype in ("float32", "bfloat16"):
        per_engine = [thresholds(CalibrationKey(dtype, engine)) for engine in GENERATING_ENGINES]
        merged = run_thresholds(dtype)
        assert merged == {key: max(found[key] for found in per_engine) for key in THRESHOLD_KEYS}
        for found in per_engine:  # no label could loosen any threshold further
            assert all(merged[key] >= found[key] for key in THRESHOLD_KEYS)
        assert run_toploc_config(dtype).model_dump() == {**ToplocConfig().model_dump(), **merged}
    # bf16: an HF worker naming vllm used to get a sampling tolerance five times its own; now every label gets it
    assert (
        run_thresholds("bfloat16")["sampling_tolerance"]
        == thresholds(CalibrationKey("bfloat16", "vllm"))["sampling_tolerance"]
    )
    assert run_toploc_config("bfloat16", own=ToplocConfig(max_exp_mismatches=3)).max_exp_mismatches == 3


def test_honest_work_of_every_engine_passes_the_run_thresholds_in_the_kept_calibration_data() -> None:
    for key in SHIPPED:
        worst, merged = honest_worst(key), run_thresholds(key.dtype)
        over = {name: (worst[name], merged[name]) for name in THRESHOLD_KEYS if worst[name] > merged[name]}
        assert not over, (key, over)


def test_detection_power_is_the_weakest_attack_of_the_precision_s_calibrations(tmp_path: Path) -> None:
    from toploc.calibrations import detection_power

    shipped = detection_power("float32")
    assert shipped.power == 1.0 and shipped.trials >= 15  # every attack trial was rejected
    for name in ("float32_hf_hf.json", "float32_vllm_hf.json"):
        shutil.copy(CALIBRATION_DIR / name, tmp_path / name)
    found = json.loads((tmp_path / "float32_vllm_hf.json").read_text())
    found["attacks"]["flipped_signs"] |= {"trials": 16, "rejected": 12}
    for key in ("cheating_trials", "cheating_trials_rejected"):
        found["attacks"]["flipped_signs"].pop(key, None)
    found["attacks"]["probe_noisy_model_tokens_policy_proofs"] |= {"trials": 16, "rejected": 0}  # a probe: not counted
    (tmp_path / "float32_vllm_hf.json").write_text(json.dumps(found))
    weakest = detection_power("float32", directory=tmp_path)
    assert (weakest.power, weakest.weakest_attack, weakest.trials) == (0.75, "flipped_signs (vllm)", 16)
