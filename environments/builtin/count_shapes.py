"""``count_shapes``: how many squares are in a rendered image; reward 1.0 for the exact count, else 0.0.

Example ``index`` is an image drawn from the environment's generator: a dark ``image_side`` x
``image_side`` canvas split into cells of ``cell_side`` pixels, with one coloured square in each of 1
to :attr:`CountShapes.max_count` randomly chosen cells, at a random offset inside its cell and a pixel
or more from its edges, so squares never touch. The text of every prompt is the same; the train/eval
split is made on the image (:mod:`environments.held_out`). The answer is the completion's first non-empty
line, stripped.
"""

from __future__ import annotations

import random

from environments.answers import first_line
from environments.base import Example, Scores, SeededEnvironment
from environments.images import Image

PALETTE = ((230, 60, 60), (60, 200, 80), (70, 110, 240), (240, 210, 60), (220, 90, 220), (80, 220, 220))
BACKGROUND = (16, 16, 16)
QUESTION = "How many squares are in the image? Answer with a number."


def render_squares(side: int, squares: list[tuple[int, int, int, tuple[int, int, int]]]) -> Image:
    """A ``side`` x ``side`` image of ``squares`` (left, top, size, colour) on the background."""
    pixels = bytearray(bytes(BACKGROUND) * (side * side))
    for left, top, size, colour in squares:
        row = bytes(colour) * size
        for y in range(top, top + size):
            start = (y * side + left) * 3
            pixels[start : start + len(row)] = row
    return Image(side, side, bytes(pixels))


class CountShapes(SeededEnvironment):
    name = "count_shapes"
    default_max_tokens = 4

    image_side = 56
    """The image's width and height in pixels (a multiple of 28 keeps a Qwen2-VL policy's patches whole)."""
    cell_side = 14
    min_square = 6
    max_square = 10
    max_count = 6

    def draw(self, index: int, rng: random.Random) -> Example:
        cells_per_row = self.image_side // self.cell_side
        count = rng.randint(1, self.max_count)
        squares = []
        for cell in rng.sample(range(cells_per_row * cells_per_row), count):
            size = rng.randint(self.min_square, self.max_square)
            left = (cell % cells_per_row) * self.cell_side + rng.randint(1, self.cell_side - size - 1)
            top = (cell // cells_per_row) * self.cell_side + rng.randint(1, self.cell_side - size - 1)
            squares.append((left, top, size, rng.choice(PALETTE)))
        image = render_squares(self.image_side, squares)
        return Example(index=index, prompt=QUESTION, answer=str(count), images=(image,))

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", 1.0 if first_line(completion) == example.answer else 0.0)
