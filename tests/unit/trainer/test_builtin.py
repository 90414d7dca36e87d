"""The built-in model and tokenizer: offline, deterministic, untied, ids stable through AutoTokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from environments.builtin import BUILTIN, builtin_environment
from environments.render import prompt_ids, prompt_text
from protocol.errors import ConfigError

TEXTS = [
    "reverse: ab cde\nedc ba",
    "12+7=19",
    "  spaces\tand\ttabs  ",
    "héllo wörld, ünïcode 日本語!",
    "it's we'll\r\n",
]


def test_built_model_is_small_untied_qwen2(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["tie_word_embeddings"] is False
    from trainer.model import load_model

    model: Any = load_model(str(tiny_model_dir))
    num_params = sum(p.numel() for p in model.parameters())
    assert 100_000 < num_params < 5_000_000
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()


def test_autotokenizer_reload_keeps_ids(tiny_model_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    trained = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    reloaded = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert type(reloaded).__name__.startswith("Qwen2Tokenizer")
    texts = TEXTS + [t for name in sorted(BUILTIN) for t in builtin_environment(name).corpus(50)]
    for text in texts:
        ids = trained.encode(text).ids
        assert reloaded.encode(text, add_special_tokens=False) == ids, text
        assert reloaded.decode(ids) == text
    assert reloaded.eos_token == "<|endoftext|>"
    assert reloaded.eos_token_id == trained.token_to_id("<|endoftext|>")
    assert 256 <= len(reloaded) <= 1024


def test_building_is_deterministic(tiny_model_dir: Path, tmp_path: Path) -> None:
    from trainer.resolve import resolve_model_path

    again = resolve_model_path("builtin:tiny-qwen2", tmp_path)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_unknown_builtin_and_missing_dir_are_explained(tmp_path: Path) -> None:
    from trainer.resolve import resolve_model_path

    with pytest.raises(ConfigError, match="known: builtin:tiny-qwen2"):
        resolve_model_path("builtin:gpt5", tmp_path)
    with pytest.raises(ConfigError, match="does not exist; give the path of a local HF checkpoint"):
        resolve_model_path(str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match=r"no config\.json"):
        resolve_model_path(str(tmp_path))


def test_builtin_prompts_are_plain_text_in_the_builtin_tokenizer(tiny_model_dir: Path) -> None:
    from trainer.model import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    environment = builtin_environment("reverse_text")
    example = environment.example(17)
    assert not tokenizer.chat_template
    assert prompt_text(environment, example, tokenizer) == example.prompt
    assert tokenizer.decode(prompt_ids(environment, example, tokenizer)) == example.prompt


def test_two_processes_wanting_one_builtin_build_it_once(tmp_path: Path) -> None:
    """The second caller waits on the build lock and takes the first one's build; a failed build leaves nothing."""
    import threading
    import time

    from trainer.builtin import resolve_model_path

    builds: list[Path] = []
    started = threading.Event()

    def slow_build(directory: Path) -> None:
        builds.append(directory)
        started.set()
        time.sleep(0.5)
        (directory / "config.json").write_text("{}")

    builders = {"tiny-qwen2": slow_build}
    results: list[Path] = []
    first = threading.Thread(
        target=lambda: results.append(resolve_model_path("builtin:tiny-qwen2", tmp_path, builders))
    )
    first.start()
    assert started.wait(10)
    second = resolve_model_path("builtin:tiny-qwen2", tmp_path, builders)  # blocks until the first build is in place
    first.join(10)
    assert len(builds) == 1
    assert results == [second] == [tmp_path / "tiny-qwen2"]
    assert (second / "config.json").is_file()

    def failing_build(directory: Path) -> None:
        raise RuntimeError("out of disk")

    with pytest.raises(RuntimeError, match="out of disk"):
        resolve_model_path("builtin:small-qwen3", tmp_path, {"small-qwen3": failing_build})
    assert not (tmp_path / "small-qwen3").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["tiny-qwen2"]
