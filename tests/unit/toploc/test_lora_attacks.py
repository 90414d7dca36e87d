"""TOPLOC in a LoRA run: the validator prefills with the pinned base and the submission version's adapter.

Honest work (the base engine serving the adapter, on either side of the adapter's own engine instance) is
accepted; the cheap substitutes a worker of a LoRA run has at hand are rejected on every trial: the base
without the adapter, an older adapter of the run (half as far trained), another run's adapter on the same
base, and the policy merged and quantized to int8.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from engines.adapted import AdapterView
from engines.base import Engine
from engines.hf import HFEngine
from tests.support.adversary import honest_claims
from tests.support.lora import int8_quantized, make_lora_adapter, merge_lora_adapter, scaled_adapter
from tests.support.tiny_model import save_tiny_qwen2
from tests.unit.toploc.test_attacks import make_tasks
from toploc.config import ToplocConfig
from toploc.verify import Claim, RolloutVerdict


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    base = save_tiny_qwen2(root / "base", seed=0)
    current = make_lora_adapter(base, root / "current", rank=4, seed=1)
    merged = merge_lora_adapter(base, current, root / "merged")
    return {
        "base": base,
        "current": current,
        "older": scaled_adapter(current, root / "older", 0.5),
        "other_run": make_lora_adapter(base, root / "other_run", rank=4, seed=2),
        "merged_int8": int8_quantized(merged, root / "merged_int8"),
    }


def serving(base: Path, adapter: Path | None, name: str = "run") -> AdapterView:
    view = AdapterView(HFEngine(base), name)
    if adapter is not None:
        view.load_weights(adapter)
    return view


@pytest.fixture(scope="module")
def validator(models: dict[str, Path]) -> AdapterView:
    return serving(models["base"], models["current"], "v5")


def verify_all(validator: AdapterView, claims: list[Claim]) -> list[RolloutVerdict]:
    from toploc.verify import verify_claims

    prefills = validator.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    return verify_claims(claims, prefills, ToplocConfig())


def test_honest_work_with_the_adapter_is_accepted(models: dict[str, Path], validator: AdapterView) -> None:
    worker = serving(models["base"], models["current"])
    tasks = make_tasks(num_prompts=16, group_size=2, max_tokens=40, seed=21)
    for verdict in verify_all(validator, honest_claims(worker, tasks)):
        assert verdict.accepted, verdict.reasons


@pytest.mark.parametrize("attack", ["base_without_adapter", "older_adapter", "other_run_adapter", "merged_int8"])
def test_a_substitute_for_the_adapter_is_rejected_on_every_trial(
    attack: str, models: dict[str, Path], validator: AdapterView
) -> None:
    cheat: Engine
    if attack == "merged_int8":
        cheat = HFEngine(models["merged_int8"])
    else:
        adapter = {"base_without_adapter": None, "older_adapter": "older", "other_run_adapter": "other_run"}[attack]
        cheat = serving(models["base"], None if adapter is None else models[adapter])
    tasks = make_tasks(num_prompts=16, group_size=1, max_tokens=40, seed=zlib.crc32(attack.encode()) % 1000)
    verdicts = verify_all(validator, honest_claims(cheat, tasks))
    assert len(verdicts) >= 10
    for verdict in verdicts:
        assert not verdict.accepted, attack
        assert any(r.startswith(("toploc", "sampling")) for r in verdict.reasons), verdict.reasons
