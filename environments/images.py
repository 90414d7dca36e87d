"""Images in prompts: RGB pixels that every party makes alike from (environment config, index), named by a hash.

An :class:`Image` is 8-bit RGB pixels, row-major, with its size. Its :attr:`Image.sha256` hashes the size
and the pixels (not an encoded file, whose bytes depend on the encoder), so a worker, a validator and the
trainer that each render example ``index`` can show they hold the same image, and the ledger can pin it
without storing or trusting pixels from anyone. PNG is only how an image is saved for people to look at.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from functools import cached_property

import PIL.Image

MAX_IMAGE_SIDE = 2048
"""The largest width or height an image may have, in pixels."""
SHA256_HEX_LENGTH = 64


@dataclass(frozen=True)
class Image:
    """An 8-bit RGB image: ``width`` x ``height`` pixels, row-major, three bytes each."""

    width: int
    height: int
    rgb: bytes = field(repr=False)

    def __post_init__(self) -> None:
        for name, side in (("width", self.width), ("height", self.height)):
            if not 1 <= side <= MAX_IMAGE_SIDE:
                raise ValueError(f"image {name} {side} is outside 1..{MAX_IMAGE_SIDE} pixels")
        if len(self.rgb) != self.width * self.height * 3:
            raise ValueError(
                f"a {self.width}x{self.height} RGB image has {self.width * self.height * 3} bytes, not {len(self.rgb)}"
            )

    @cached_property
    def sha256(self) -> str:
        """The image's name: SHA-256 of its size and pixels, hex."""
        return hashlib.sha256(f"rgb8 {self.width}x{self.height}\n".encode() + self.rgb).hexdigest()

    def to_pil(self) -> PIL.Image.Image:
        return PIL.Image.frombytes("RGB", (self.width, self.height), self.rgb)

    @classmethod
    def from_pil(cls, image: PIL.Image.Image) -> Image:
        rgb = image.convert("RGB")
        return cls(rgb.width, rgb.height, rgb.tobytes())

    def png(self) -> bytes:
        """The image as a PNG file (for people; the hash is of the pixels)."""
        buffer = io.BytesIO()
        self.to_pil().save(buffer, format="PNG")
        return buffer.getvalue()

    @classmethod
    def from_png(cls, data: bytes) -> Image:
        with PIL.Image.open(io.BytesIO(data)) as image:
            return cls.from_pil(image)


def image_hashes(images: tuple[Image, ...]) -> tuple[str, ...]:
    """The images' names, in order."""
    return tuple(image.sha256 for image in images)
