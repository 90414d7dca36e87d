"""The built-in environments, made by this project: ``reverse_text``, ``arithmetic`` and ``sort_digits``
(single-turn), ``count_shapes`` (single-turn, with an image) and ``calculator`` (multi-turn, with a tool);
offline, seeded."""

from __future__ import annotations

from collections.abc import Callable

from environments.base import SeededEnvironment
from environments.builtin.arithmetic import Arithmetic
from environments.builtin.calculator import Calculator
from environments.builtin.count_shapes import CountShapes
from environments.builtin.reverse_text import ReverseText
from environments.builtin.sort_digits import SortDigits

BUILTIN: dict[str, Callable[[int], SeededEnvironment]] = {
    "reverse_text": ReverseText,
    "arithmetic": Arithmetic,
    "sort_digits": SortDigits,
    "calculator": Calculator,
    "count_shapes": CountShapes,
}
"""Built-in environment name -> factory of a seed."""


def builtin_environment(name: str, seed: int = 0) -> SeededEnvironment:
    """The built-in environment ``name`` with its example generator seeded by ``seed``."""
    try:
        return BUILTIN[name](seed)
    except KeyError:
        raise ValueError(f"unknown built-in environment {name!r}; known: {', '.join(sorted(BUILTIN))}") from None
