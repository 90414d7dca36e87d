"""The built-in vision-language model: built offline, its image processor and vision tokens read back, and an image
that reaches its logits through :class:`engines.vision.VisionInputs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engines.vision import IMAGE_PAD, VISION_END, VISION_START, VisionInputs
from environments.builtin import builtin_environment
from environments.images import Image
from trainer.builtin import BUILTIN_PREFIX, SMALL_QWEN3, TINY_QWEN2_VL
from trainer.resolve import resolve_model_path


@pytest.fixture(scope="module")
def vl_dir() -> Path:
    return resolve_model_path(BUILTIN_PREFIX + TINY_QWEN2_VL)


@pytest.fixture(scope="module")
def vl_model(vl_dir: Path) -> Any:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(vl_dir), dtype=torch.float32).eval()


def _prompt_ids(vl_dir: Path, vision: VisionInputs, image: Image, question: str) -> torch.Tensor:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(vl_dir))
    content = vision.image_block(image) + question
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return torch.tensor([tokenizer.encode(text, add_special_tokens=False)])


def test_a_text_checkpoint_has_no_vision_inputs() -> None:
    assert VisionInputs.of_checkpoint(resolve_model_path(BUILTIN_PREFIX + SMALL_QWEN3)) is None


def test_an_image_is_a_block_of_one_token_per_merged_patch(vl_dir: Path) -> None:
    vision = VisionInputs.of_checkpoint(vl_dir)
    assert vision is not None
    image = builtin_environment("count_shapes").example(0).images[0]  # 56 x 56: 4 x 4 patches, merged 2 x 2
    inputs = vision.pixel_inputs((image,))
    assert inputs.image_grid_thw.tolist() == [[1, 4, 4]]
    assert inputs.pixel_values.shape == (16, 3 * 2 * 14 * 14)
    assert vision.num_image_tokens(image) == 4
    assert vision.image_block(image) == VISION_START + IMAGE_PAD * 4 + VISION_END
    ids = _prompt_ids(vl_dir, vision, image, "How many?")
    assert int(vision.image_token_mask(ids).sum()) == 4  # each pad is one token of the vocabulary
    assert ids[0].tolist().count(vision.vision_start_token_id) == 1


def test_the_model_sees_the_image(vl_dir: Path, vl_model: Any) -> None:
    vision = VisionInputs.of_checkpoint(vl_dir)
    assert vision is not None
    environment = builtin_environment("count_shapes")
    first, second = environment.example(0).images[0], environment.example(1).images[0]
    assert first.sha256 != second.sha256

    def last_logits(image: Image) -> torch.Tensor:
        ids = _prompt_ids(vl_dir, vision, image, environment.example(0).prompt)  # type: ignore[arg-type]
        inputs = vision.pixel_inputs((image,))
        with torch.no_grad():
            output = vl_model(
                input_ids=ids,
                pixel_values=inputs.pixel_values,
                image_grid_thw=inputs.image_grid_thw,
                mm_token_type_ids=vision.image_token_mask(ids),
            )
        logits: torch.Tensor = output.logits[0, -1]
        return logits

    once = last_logits(first)
    assert torch.isfinite(once).all()
    assert torch.equal(once, last_logits(first))  # the same image, the same numbers
    assert not torch.allclose(once, last_logits(second))  # another image, other numbers


def test_the_count_start_trains_the_text_model_and_keeps_the_vision_tower(
    vl_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count_shapes start's build path with a short recipe: a vision-language checkpoint whose vision tower
    is the base's, byte for byte, and whose text model moved."""
    from safetensors.torch import load_file

    import trainer.resolve
    from trainer.builtin import COUNT_START
    from trainer.start import COUNT_RECIPE

    short = COUNT_RECIPE.__class__(environment=COUNT_RECIPE.environment, num_steps=3, batch_size=8, lr=COUNT_RECIPE.lr)
    monkeypatch.setitem(trainer.resolve.STARTS, COUNT_START, (TINY_QWEN2_VL, short))
    start = resolve_model_path(BUILTIN_PREFIX + COUNT_START, tmp_path)
    assert VisionInputs.of_checkpoint(start) is not None
    base = load_file(str(resolve_model_path(BUILTIN_PREFIX + TINY_QWEN2_VL, tmp_path) / "model.safetensors"))
    trained = load_file(str(start / "model.safetensors"))
    assert set(base) == set(trained)
    tower = [name for name in base if ".visual." in name or name.startswith("visual.")]
    assert tower and all(torch.equal(base[name], trained[name]) for name in tower)
    assert any(not torch.equal(base[name], trained[name]) for name in set(base) - set(tower))
