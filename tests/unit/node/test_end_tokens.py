"""The end tokens of a checkpoint: every one its configs, tokenizer and chat template name, once each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from node.startup import eos_token_ids
from trainer.resolve import resolve_model_path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML template: an assistant turn ends with <|im_end|> (id 2 in the built-in tokenizer)."""


def checkpoint(tmp_path: Path, config: object, generation: object, tokenizer_eos: str, template: str | None) -> Path:
    """Config files and the built-in tokenizer (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2), no weights."""
    path = tmp_path / "policy"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"eos_token_id": config}))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation}))
    tokenizer_dir = resolve_model_path("builtin:tiny-qwen2")
    shutil.copyfile(tokenizer_dir / "tokenizer.json", path / "tokenizer.json")
    settings = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    settings["eos_token"] = tokenizer_eos
    if template is not None:
        settings["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(settings))
    return path


def test_every_end_token_the_checkpoint_names_ends_a_completion(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 7, [9, 7], "<|endoftext|>", CHAT_TEMPLATE)
    assert eos_token_ids(path) == (9, 7, 0, 2), "generation config, model config, tokenizer EOS, end of turn"


def test_a_tokenizer_that_ends_on_another_token_than_the_config_adds_it(tmp_path: Path) -> None:
    assert eos_token_ids(checkpoint(tmp_path, 2, None, "<|im_start|>", None)) == (2, 1)


def test_config_only_checkpoints_and_junk_values_keep_what_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "bare"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"eos_token_id": [3, True, "x", 3]}))
    assert eos_token_ids(path) == (3,)
