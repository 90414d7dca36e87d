"""HF engine with LoRA adapters: PEFT's arithmetic, one base serving several adapters, in-place replacement,
and adapter directories refused before anything is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.adapters import AdapterError, read_adapter
from engines.base import GenerationRequest
from engines.hf import HFEngine
from tests.support.lora import make_lora_adapter, merge_lora_adapter
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, TinyModelSpec, save_tiny_model
from toploc.sampling import sample_stream


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("base"), seed=0)


@pytest.fixture(scope="module")
def adapters(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_lora_adapter(base_dir, root / name, rank=4, seed=seed) for name, seed in (("a", 1), ("b", 2))}


def _merged(base_dir: Path, adapter_dir: Path, out: Path) -> Path:
    """The base with the adapter merged by PEFT itself: the reference an adapter-serving engine must match."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().save_pretrained(out)
    return out


def _requests(adapter: str | None, num: int = 6, max_tokens: int = 16) -> list[GenerationRequest]:
    generator = torch.Generator().manual_seed(3)
    return [
        GenerationRequest(
            uid=f"{adapter}/{i}",
            prompt_ids=torch.randint(2, 1024, (3 + i,), generator=generator).tolist(),
            max_tokens=max_tokens,
            temperature=1.0,
            seed=11,
            stream=sample_stream(i, 0),
            eos_token_ids=(TINY_EOS_TOKEN_ID,),
            adapter=adapter,
        )
        for i in range(num)
    ]


def test_an_adapter_on_the_base_computes_what_peft_merged_computes(
    base_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    engine = HFEngine(base_dir)
    engine.load_adapter("run", adapters["a"])
    reference = HFEngine(_merged(base_dir, adapters["a"], tmp_path / "merged"))
    got, want = engine.generate(_requests("run")), reference.generate(_requests(None))
    assert [g.completion_ids for g in got] == [w.completion_ids for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.hidden_states, w.hidden_states, atol=1e-4, rtol=1e-4)
    prompts = [r.prompt_ids for r in _requests(None)]
    completions = [g.completion_ids for g in got]
    prefills = zip(engine.prefill(prompts, completions, "run"), reference.prefill(prompts, completions), strict=True)
    for prefill, expected in prefills:
        torch.testing.assert_close(prefill.logits, expected.logits, atol=1e-4, rtol=1e-4)


def test_one_base_serves_the_base_and_two_adapters_in_one_call(base_dir: Path, adapters: dict[str, Path]) -> None:
    alone = {name: HFEngine(base_dir) for name in ("a", "b")}
    for name, engine in alone.items():
        engine.load_adapter(name, adapters[name])
    base_only = HFEngine(base_dir)
    shared = HFEngine(base_dir)
    shared.load_adapter("a", adapters["a"])
    shared.load_adapter("b", adapters["b"])
    mixed = [*_requests("b"), *_requests(None), *_requests("a")]
    results = {r.uid: r.completion_ids for r in shared.generate(mixed)}
    for name in ("a", "b"):
        assert [results[r.uid] for r in _requests(name)] == [
            r.completion_ids for r in alone[name].generate(_requests(name))
        ]
    assert [results[r.uid] for r in _requests(None)] == [r.completion_ids for r in base_only.generate(_requests(None))]
    assert [results[r.uid] for r in _requests("a")] != [results[r.uid] for r in _requests("b")]


def test_a_new_version_of_an_adapter_replaces_it_in_place(base_dir: Path, adapters: dict[str, Path]) -> None:
    engine = HFEngine(base_dir)
    reference = HFEngine(base_dir)
    reference.load_adapter("b", adapters["b"])
    engine.load_adapter("run.v1@host:1", adapters["a"])  # any name: PEFT's module names are the engine's own

    def first_lora_a() -> torch.nn.Parameter:
        found: torch.nn.Parameter = next(p for n, p in engine.model.named_parameters() if "q_proj.lora_A" in n)
        return found

    weight = first_lora_a()
    engine.load_adapter("run.v1@host:1", adapters["b"])
    assert first_lora_a() is weight  # copied in place
    engine.load_adapter("run", adapters["b"])
    engine.remove_adapter("run.v1@host:1")
    want = [r.completion_ids for r in reference.generate(_requests("b"))]
    assert [r.completion_ids for r in engine.generate(_requests("run"))] == want
    engine.remove_adapter("run")
    with pytest.raises(ValueError, match="no LoRA adapter 'run' is loaded"):
        engine.generate(_requests("run"))


def _copy_with_config(source: Path, target: Path, **changes: Any) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "adapter_config.json").read_text())
    (target / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return target


def test_adapters_that_are_not_plain_lora_of_this_base_are_refused(
    base_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    with pytest.raises(AdapterError, match="use_dora"):
        read_adapter(_copy_with_config(adapters["a"], tmp_path / "dora", use_dora=True))
    with pytest.raises(AdapterError, match="not rank 8"):
        read_adapter(_copy_with_config(adapters["a"], tmp_path / "rank", r=8))
    with pytest.raises(AdapterError, match="cannot be read as JSON"):
        read_adapter(tmp_path)
    poisoned = shutil.copytree(adapters["a"], tmp_path / "nan")
    tensors = load_file(str(poisoned / "adapter_model.safetensors"))
    first = sorted(tensors)[0]
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    save_file(tensors, str(poisoned / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match="not a finite"):
        read_adapter(poisoned)

    wider = save_tiny_model(tmp_path / "wider", seed=0, spec=TinyModelSpec(hidden_size=96))
    engine = HFEngine(base_dir)
    with pytest.raises(ValueError, match="the base"):
        engine.load_adapter("run", make_lora_adapter(wider, tmp_path / "wider-adapter", rank=4))
    engine.load_adapter("run", adapters["a"])  # the engine is still usable
    with pytest.raises(ValueError, match="does not reload the base"):
        engine.load_weights(base_dir)


@pytest.fixture(scope="module")
def moe_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(architecture="qwen3_moe", num_attention_heads=2, num_key_value_heads=1)
    return save_tiny_model(tmp_path_factory.mktemp("moe"), seed=0, spec=spec)


def test_an_moe_adapter_adapts_every_expert_and_the_router(moe_base: Path, tmp_path: Path) -> None:
    """PEFT's all-linear on Qwen3-MoE adapts the stacked experts and the router as parameters (fused gate-and-up at
    twice the rank); the engine serves that adapter as PEFT's merge of it computes, and loads it in place."""
    adapter_dir = make_lora_adapter(moe_base, tmp_path / "adapter", rank=4, seed=1)
    adapter = read_adapter(adapter_dir)
    assert {"gate_up_proj", "down_proj", "gate.weight"} <= set(adapter.target_parameters)
    experts = adapter.weights["model.layers.0.mlp.experts"]  # down_proj: 4 experts of rank 4 in one A and B
    assert experts[0].shape == (16, 64) and experts[1].shape == (64, 16)
    assert adapter.weights["model.layers.0.mlp.experts.base_layer"][0].shape == (32, 64)  # gate_up_proj: rank 8

    engine = HFEngine(moe_base)
    engine.load_adapter("run", adapter_dir)
    engine.load_adapter("run", adapter_dir)  # a new version of the same shape: copied in place
    reference = HFEngine(merge_lora_adapter(moe_base, adapter_dir, tmp_path / "merged"))
    got, want = engine.generate(_requests("run")), reference.generate(_requests(None))
    assert [g.completion_ids for g in got] == [w.completion_ids for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.hidden_states, w.hidden_states, atol=1e-4, rtol=1e-4)
    base = [r.completion_ids for r in HFEngine(moe_base).generate(_requests(None))]
    assert base != [w.completion_ids for w in want]

    with pytest.raises(AdapterError, match="not plain LoRA"):  # a pattern with its own scale
        read_adapter(_copy_with_config(adapter_dir, tmp_path / "scale", alpha_pattern={".*\\.gate_up_proj": 4}))
