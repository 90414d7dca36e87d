"""The ``[toploc]`` section of a validator's config: proof layout and acceptance thresholds.

A validator audits with the calibration that matches the run (toploc.calibrations): one per
(dtype, generating engine, verifying engine), measured by ``bench/toploc_calibrate.py`` and kept
in ``toploc/calibration/<dtype>_<engine>_hf.json``; thresholds set explicitly in this section
override the calibration's. The defaults below are the float32 HF calibration
(``toploc/calibration/float32_hf_hf.json``; a unit test keeps the two in step). Honest float32
work under every variation calibrated there (batch sizes 1 to 64, left padding, 1 or 2 torch
threads, states captured during generation vs recomputed by prefill) stays far inside them; the
attacks of ``tests/support/adversary.py`` land far outside. bfloat16 rounds far more: its own
calibrations (``bfloat16_hf_hf.json``, ``bfloat16_vllm_hf.json``, on a ~50M-parameter model) allow
several times the mantissa error and logprob difference, and a run declaring a precision with no
calibration is refused at start-up.
"""

from __future__ import annotations

from pydantic import Field

from runtime.config import Section


class ToplocConfig(Section):
    """How proofs are laid out and when a rollout's proof and tokens are accepted."""

    chunk_size: int = Field(default=32, ge=1, le=4096)
    """Decode tokens per proof chunk (one polynomial each)."""
    topk: int = Field(default=128, ge=1, le=4096)
    """Activations committed per chunk (the largest by magnitude); 258 bytes per chunk at 128."""
    max_exp_mismatches: int = Field(default=8, ge=0)
    """Most top-k entries per chunk whose bf16 exponent may differ from the recomputed one."""
    max_sign_mismatches: int = Field(default=2, ge=0)
    """Most top-k entries per chunk whose exponent agrees but whose sign does not."""
    max_mant_err_mean: float = Field(default=0.0625, ge=0)
    """Largest mean |mantissa difference| (7-bit units) over a chunk's exponent-matching entries."""
    mant_err_sum_allowance: int = Field(default=1, ge=0)
    """A chunk whose total |mantissa difference| is at most this passes the mean check whatever its size.

    A short tail chunk commits few entries (12 for 3 rows of a 64-wide model), so one honest
    rounding flip of one unit would put its mean above ``max_mant_err_mean``."""
    max_mant_err_median: float = Field(default=0.5, ge=0)
    """Largest median |mantissa difference| over a chunk's exponent-matching entries."""
    sampling_tolerance: float = Field(default=1e-4, ge=0)
    """Largest accepted gap between the best noisy score and the claimed token's (near ties)."""
    logprob_tolerance: float = Field(default=1e-3, ge=0)
    """Largest accepted |claimed - recomputed| log-probability of a token."""
