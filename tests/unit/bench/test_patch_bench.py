"""The value-patch bench end to end on a tiny model: every rebuilt version exact (on disk and through relays).

The versions are the real trainer's (AdamW steps exported in bf16), eleven in a row per learning
rate, each rebuilt from the one before and hashed against the exported checkpoint.
"""

from __future__ import annotations

import pytest

from bench.patch_bench import main

TINY = ["--hidden", "64", "--layers", "1", "--intermediate", "128", "--vocab", "1000", "--steps", "11", "--skip", "1"]
SMALL_BATCH = ["--prompts", "1", "--group", "2", "--prompt-tokens", "4", "--completion-tokens", "4"]


@pytest.mark.slow
def test_a_chain_of_trained_versions_is_rebuilt_exactly() -> None:
    document = main(TINY + SMALL_BATCH)
    result = document["summary"]
    assert result["exact"] == 1
    for key in ("bytes_ratio_lr1e6", "entropy_bound_ratio_lr1e6", "limit_fraction_lr1e6", "bytes_ratio_lr1e5"):
        assert result[key] > 0
    assert 0 < result["unchanged_fraction_lr1e6"] < 1
    assert result["unchanged_fraction_lr1e5"] < result["unchanged_fraction_lr1e6"]
    assert result["params"] == 169_344
    assert [r["step"] for r in document["runs"]["lr1e-06"]] == list(range(1, 12))
    assert {"data", "lrs", "steps", "start_weights"} <= set(document["config"])
    # through 1 origin, 2 relays and 4 clients holding the base: full, then as a patch
    assert result["broadcast_exact"] == 1
    assert result["full_fetch_s"] > 0 and result["apply_s"] > 0
    assert 0 < result["broadcast_patch_bytes"] < result["broadcast_full_bytes"]
    assert result["broadcast_speedup"] == round(result["broadcast_full_s"] / result["broadcast_patch_s"], 3)
    assert {key: document["config"]["broadcast"][key] for key in ("origins", "relays", "clients")} == {
        "origins": 1,
        "relays": 2,
        "clients": 4,
    }
    assert document["broadcast_runs"]["patch"]["client_bytes"] == [result["broadcast_patch_bytes"]] * 4
