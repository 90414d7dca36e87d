"""Images in prompts: pixels named by a hash of size and pixels, and the ``count_shapes`` task drawn from its seed."""

from __future__ import annotations

import pytest

from environments.builtin import builtin_environment
from environments.builtin.count_shapes import BACKGROUND, CountShapes
from environments.held_out import check_held_out, is_held_out, prompt_key
from environments.images import Image
from environments.pinning import ImageMismatch, prompt_images
from environments.render import prompt_ids


def _squares(image: Image) -> int:
    """Connected regions of non-background pixels (4-neighbours): an independent count of the drawn squares."""
    side, pixels = image.width, image.rgb
    lit = {
        (x, y)
        for y in range(side)
        for x in range(side)
        if pixels[(y * side + x) * 3 : (y * side + x) * 3 + 3] != bytes(BACKGROUND)
    }
    regions = 0
    while lit:
        regions += 1
        frontier = [lit.pop()]
        while frontier:
            x, y = frontier.pop()
            for near in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if near in lit:
                    lit.remove(near)
                    frontier.append(near)
    return regions


def test_an_image_is_named_by_its_size_and_pixels_and_survives_png() -> None:
    image = Image(2, 1, bytes([255, 0, 0, 0, 0, 255]))
    assert image.sha256 == Image(2, 1, bytes([255, 0, 0, 0, 0, 255])).sha256
    assert image.sha256 != Image(1, 2, image.rgb).sha256  # same bytes, another shape
    assert image.sha256 != Image(2, 1, bytes([255, 0, 0, 0, 0, 254])).sha256
    assert Image.from_png(image.png()) == image


@pytest.mark.parametrize(("width", "height", "size"), [(0, 1, 0), (1, 1, 2), (3000, 1, 9000)])
def test_an_image_of_the_wrong_size_is_refused(width: int, height: int, size: int) -> None:
    with pytest.raises(ValueError, match=r"image|bytes"):
        Image(width, height, bytes(size))


def test_count_shapes_draws_the_same_image_for_an_index_and_counts_it() -> None:
    environment = builtin_environment("count_shapes")
    again = builtin_environment("count_shapes")
    counts = set()
    for index in range(40):
        example = environment.example(index)
        (image,) = example.images
        assert again.example(index).images[0].sha256 == image.sha256
        assert (image.width, image.height) == (CountShapes.image_side, CountShapes.image_side)
        assert example.answer == str(_squares(image))
        counts.add(example.answer)
    assert counts == {str(n) for n in range(1, CountShapes.max_count + 1)}
    assert (
        builtin_environment("count_shapes", seed=1).example(0).images[0].sha256
        != environment.example(0).images[0].sha256
    )


def test_count_shapes_splits_train_and_eval_on_the_image() -> None:
    environment = builtin_environment("count_shapes")
    train = environment.example(3)
    held = environment.eval_example(3)
    assert train.prompt == held.prompt  # the same question: only the image tells them apart
    assert not is_held_out(train.prompt, [train.images[0].sha256])
    assert is_held_out(held.prompt, [held.images[0].sha256])
    check_held_out(environment, num_train=512, num_eval=32)


def test_a_prompt_without_images_keys_as_before() -> None:
    assert prompt_key("12+3=") == "12+3="
    assert prompt_key("q", ["ab"]) == "q\nimage: ab"


def test_count_shapes_rewards_the_exact_count_only() -> None:
    environment = builtin_environment("count_shapes")
    example = environment.example(0)
    assert environment.reward(example, f" {example.answer}\nmore") == 1.0
    assert environment.reward(example, f"{example.answer}0") == 0.0


class TextTokenizer:
    """A text-only policy's tokenizer: no chat template, no image tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def test_a_text_only_policy_is_refused_an_image_prompt() -> None:
    environment = builtin_environment("count_shapes")
    with pytest.raises(ValueError, match="reads text only"):
        prompt_ids(environment, environment.example(0), TextTokenizer())


def test_a_nodes_images_of_a_prompt_are_checked_against_the_pinned_hashes() -> None:
    environment = builtin_environment("count_shapes")
    pinned = [environment.example(5).images[0].sha256]
    assert prompt_images(environment, 5, pinned) == environment.example(5).images
    assert prompt_images(environment, None, []) == ()  # a text prompt
    with pytest.raises(ImageMismatch, match="differs from the run's"):
        prompt_images(builtin_environment("count_shapes", seed=1), 5, pinned)  # another seed: other pictures
    with pytest.raises(ImageMismatch, match="names no example"):
        prompt_images(environment, None, pinned)
