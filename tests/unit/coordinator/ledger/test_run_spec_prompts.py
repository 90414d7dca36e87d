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


COUNT_SHAPES = {"type": "builtin", "name": "count_shapes"}


def test_an_image_run_needs_a_vision_language_start_checkpoint(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        data_dir=tmp_path / "run",
        policy={"start_checkpoint": str(save_tiny_qwen2(tmp_path / "policy"))},
        environment=COUNT_SHAPES,
    )
    with pytest.raises(ConfigError, match=r"'count_shapes' shows images.*reads text only.*tiny-qwen2-vl"):
        run_spec.environment_prompts(config)


def test_an_image_runs_prompts_hold_the_policys_image_blocks_and_its_spec_says_so(tmp_path: Path) -> None:
    from engines.vision import VisionInputs
    from environments.builtin import builtin_environment
    from environments.images import image_hashes
    from protocol.identity import NodeIdentity
    from trainer.resolve import resolve_model_path

    config = CoordinatorConfig(
        data_dir=tmp_path / "run", policy={"start_checkpoint": "builtin:tiny-qwen2-vl"}, environment=COUNT_SHAPES
    )
    prompts = run_spec.environment_prompts(config)
    vision = VisionInputs(resolve_model_path("builtin:tiny-qwen2-vl"))
    environment = builtin_environment("count_shapes")
    for prompt in prompts.prompt_group(3, 2):
        images = environment.example(prompt.example_index or 0).images
        assert prompt.image_sha256 == image_hashes(images)
        assert prompt.token_ids.count(vision.image_token_id) == sum(vision.num_image_tokens(i) for i in images)
    signed = run_spec.signed_run_spec(config, NodeIdentity.generate(), prompts)
    assert signed.spec.images and not run_spec.run_spec(config).images


def test_a_lora_image_run_is_refused_with_its_reason(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        data_dir=tmp_path / "run",
        policy={"start_checkpoint": "builtin:tiny-qwen2-vl"},
        environment=COUNT_SHAPES,
        orchestrator={"trainer": {"lora": {"enabled": True}}},
    )
    with pytest.raises(ConfigError, match="LoRA runs train text-only policies"):
        run_spec.environment_prompts(config)


def test_a_local_network_of_vllm_workers_is_refused_for_a_vision_language_policy(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        data_dir=tmp_path / "run",
        policy={"start_checkpoint": "builtin:tiny-qwen2-vl"},
        local_network={"enabled": True},  # its default engines: vLLM and HF
    )
    with pytest.raises(ConfigError, match=r"vLLM workers do not run; set local_network.engines = \["):
        run_spec.environment_prompts(config)  # a text environment too: vLLM would draw the vision tokens


def test_the_door_knows_a_vision_language_policys_vocabulary(tmp_path: Path) -> None:
    from coordinator.loop.policies import with_vocab_size
    from trainer.resolve import resolve_model_path

    config = CoordinatorConfig(data_dir=tmp_path / "run")
    assert with_vocab_size(config, resolve_model_path("builtin:tiny-qwen2-vl")).policy.vocab_size == 516
