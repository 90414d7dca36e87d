"""The built-in small Qwen3: untied, a subword tokenizer with a chat template, ids stable through AutoTokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from environments.builtin import builtin_environment
from environments.render import prompt_ids, prompt_text


@pytest.fixture(scope="session")
def small_qwen3_dir(builtin_dir: Path) -> Path:
    from trainer.resolve import resolve_model_path

    return resolve_model_path("builtin:small-qwen3")


def test_small_qwen3_is_an_untied_qwen3_of_a_few_million_parameters(small_qwen3_dir: Path) -> None:
    config = json.loads((small_qwen3_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["tie_word_embeddings"] is False
    from trainer.model import load_model

    model: Any = load_model(str(small_qwen3_dir))
    num_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < num_params < 10_000_000
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()


def test_chat_template_prompt_ends_at_the_assistant_turn_and_eos_ends_it(small_qwen3_dir: Path) -> None:
    from tokenizers import Tokenizer

    from trainer.model import load_tokenizer

    tokenizer = load_tokenizer(str(small_qwen3_dir))
    environment = builtin_environment("arithmetic")
    example = environment.example(3)
    text = prompt_text(environment, example, tokenizer)
    assert text == f"<|im_start|>user\n{example.prompt}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"
    trained = Tokenizer.from_file(str(small_qwen3_dir / "tokenizer.json"))
    assert prompt_ids(environment, example, tokenizer) == trained.encode(text).ids
    generation = json.loads((small_qwen3_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id == trained.token_to_id("<|im_end|>")


def test_subword_tokenizer_merges_words_and_reloads_with_the_same_ids(small_qwen3_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    trained = Tokenizer.from_file(str(small_qwen3_dir / "tokenizer.json"))
    reloaded = AutoTokenizer.from_pretrained(str(small_qwen3_dir))
    assert type(reloaded).__name__.startswith("Qwen2Tokenizer")
    assert trained.encode("reverse").tokens == ["reverse"]
    assert trained.encode("assistant").tokens == ["assistant"]
    texts = ["reverse: ab cde\n", "12+7=19", "héllo wörld, ünïcode 日本語!", "it's we'll\r\n"]
    texts += [t for name in ("arithmetic", "reverse_text", "sort_digits") for t in builtin_environment(name).corpus(50)]
    for text in texts:
        ids = trained.encode(text).ids
        assert reloaded.encode(text, add_special_tokens=False) == ids, text
        assert reloaded.decode(ids) == text
    assert 300 < len(reloaded) <= 512


def test_building_small_qwen3_is_deterministic(small_qwen3_dir: Path, tmp_path: Path) -> None:
    from trainer.resolve import resolve_model_path

    again = resolve_model_path("builtin:small-qwen3", tmp_path)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (small_qwen3_dir / name).read_bytes(), name


def test_the_arithmetic_start_is_built_deterministically_once_and_then_cached(
    small_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's build path (base model, SFT, export) with a short recipe: two caches get the same bytes,
    and a second use of one cache loads what is there instead of training again."""
    import trainer.resolve
    import trainer.start
    from trainer.resolve import resolve_model_path
    from trainer.start import StartRecipe

    short = StartRecipe(environment="arithmetic", num_steps=3, batch_size=8, lr=2e-3)
    monkeypatch.setitem(trainer.resolve.STARTS, "small-qwen3-arithmetic-start", ("small-qwen3", short))
    first = resolve_model_path("builtin:small-qwen3-arithmetic-start", tmp_path / "a")
    second = resolve_model_path("builtin:small-qwen3-arithmetic-start", tmp_path / "b")
    assert json.loads((first / "config.json").read_text())["model_type"] == "qwen3"
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (small_qwen3_dir / "model.safetensors").read_bytes()

    def no_training(*args: Any, **kwargs: Any) -> Path:
        raise AssertionError("a cached start checkpoint was built again")

    monkeypatch.setattr(trainer.start, "build_start_checkpoint", no_training)
    monkeypatch.setattr(trainer.resolve, "build_start_checkpoint", no_training)
    assert resolve_model_path("builtin:small-qwen3-arithmetic-start", tmp_path / "a") == first


def test_a_task_added_to_the_builtins_changes_no_built_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizers train on a fixed list of tasks: a registry that grows would otherwise silently change every
    built-in model built after it, and leave the ones cached before it different."""
    import environments.builtin
    from trainer.builtin import builtin_tokenizer, chat_tokenizer

    before = (chat_tokenizer().to_str(), builtin_tokenizer().to_str())
    monkeypatch.setitem(environments.builtin.BUILTIN, "zz_added", environments.builtin.BUILTIN["sort_digits"])
    assert (chat_tokenizer().to_str(), builtin_tokenizer().to_str()) == before
