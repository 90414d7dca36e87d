"""The coordinator's prompts are checked at start-up: a tokenizer that encodes them to nothing is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import coordinator.ledger.run_spec as run_spec
from coordinator.config import CoordinatorConfig
from protocol.errors import ConfigError
from tests.support.tiny_model import save_tiny_qwen2


class SilentTokenizer:
    """A tokenizer without a chat template that encodes every text to no tokens."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return []


class ByteTokenizer(SilentTokenizer):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


@pytest.mark.parametrize(("tokenizer", "refused"), [(SilentTokenizer(), True), (ByteTokenizer(), False)])
def test_prompts_that_encode_to_nothing_are_refused_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer: Any, refused: bool
) -> None:
    import transformers

    checkpoint = save_tiny_qwen2(tmp_path / "policy")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *_args, **_kw: tokenizer)
    config = CoordinatorConfig(data_dir=tmp_path / "run", policy={"start_checkpoint": str(checkpoint)})
    if refused:
        with pytest.raises(ConfigError, match="encodes to no tokens"):
            run_spec.environment_prompts(config)
    else:
        prompts = run_spec.environment_prompts(config).prompt_group(0, 2)
        assert all(prompt.token_ids for prompt in prompts)


def test_an_image_environment_is_refused_at_start_up_while_nodes_cannot_show_images(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        data_dir=tmp_path / "run",
        policy={"start_checkpoint": str(save_tiny_qwen2(tmp_path / "policy"))},
        environment={"type": "builtin", "name": "count_shapes"},
    )
    with pytest.raises(ConfigError, match="'count_shapes' shows images"):
        run_spec.environment_prompts(config)
