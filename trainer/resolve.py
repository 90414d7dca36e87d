"""Every model name a config may give, resolved to a local checkpoint directory, built-ins built on first use.

A name is a local HF checkpoint directory or a built-in: ``builtin:tiny-qwen2`` and
``builtin:small-qwen3`` (random weights, :mod:`trainer.builtin`), ``builtin:tiny-qwen2-reverse-start``,
``builtin:small-qwen3-arithmetic-start``, ``builtin:small-qwen3-sort-start`` and
``builtin:small-qwen3-calculator-start`` (RL starts, early SFTs of those: :mod:`trainer.start`), and
``builtin:tiny-qwen2-vl`` with its start ``builtin:tiny-qwen2-vl-count-start``.
Entry points (the CLIs, the coordinator, benches) resolve names here before a trainer or an engine
loads them; :mod:`trainer.model` sits below the trainer and only loads directories and built-ins
already built, so loading a model never runs SFT.
"""

from __future__ import annotations

from pathlib import Path

from protocol.errors import ConfigError
from trainer.builtin import (
    ARITHMETIC_START,
    BUILTIN_PREFIX,
    CALCULATOR_START,
    COUNT_START,
    REVERSE_START,
    SMALL_QWEN3,
    SORT_START,
    TINY_QWEN2,
    TINY_QWEN2_VL,
    UNTRAINED_BUILDERS,
    Builder,
)
from trainer.builtin import resolve_model_path as resolve_with
from trainer.start import (
    ARITHMETIC_RECIPE,
    CALCULATOR_RECIPE,
    COUNT_RECIPE,
    REVERSE_RECIPE,
    SORT_RECIPE,
    StartRecipe,
    build_start_checkpoint,
)

STARTS: dict[str, tuple[str, StartRecipe]] = {
    REVERSE_START: (TINY_QWEN2, REVERSE_RECIPE),
    ARITHMETIC_START: (SMALL_QWEN3, ARITHMETIC_RECIPE),
    SORT_START: (SMALL_QWEN3, SORT_RECIPE),
    CALCULATOR_START: (SMALL_QWEN3, CALCULATOR_RECIPE),
    COUNT_START: (TINY_QWEN2_VL, COUNT_RECIPE),
}
"""Each RL start checkpoint: the built-in it is made from and how (read when it is built)."""


def _start_builder(name: str) -> Builder:
    def build(output_dir: Path) -> None:
        base, recipe = STARTS[name]
        base_dir = resolve_with(BUILTIN_PREFIX + base, output_dir.parent)
        build_start_checkpoint(output_dir, str(base_dir), recipe)

    return build


BUILDERS: dict[str, Builder] = {**UNTRAINED_BUILDERS, **{name: _start_builder(name) for name in STARTS}}


def resolve_model_path(name: str, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory of ``name``; a built-in is built in the cache dir on first use."""
    return resolve_with(name, cache_dir, BUILDERS)


DEMO_START = SORT_START
"""The demo's RL start checkpoint (configs/demo.toml), what `prime-trainer start-checkpoint` builds by default."""


def build_builtin(name: str, output_dir: Path | None = None) -> Path:
    """`prime-trainer start-checkpoint NAME`: the built-in ``name`` (``builtin:`` optional) in the built-in cache
    (built there unless it is), or built into ``output_dir`` instead (a start's base model from the cache)."""
    bare = name.removeprefix(BUILTIN_PREFIX)
    if bare not in BUILDERS:
        known = ", ".join(BUILTIN_PREFIX + known for known in BUILDERS)
        raise ConfigError(f"{name!r} is not a built-in model; the built-ins are {known}")
    if output_dir is None:
        return resolve_model_path(BUILTIN_PREFIX + bare)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ConfigError(f"{output_dir} is not empty: give a new or empty directory for {BUILTIN_PREFIX}{bare}")
    output_dir.mkdir(parents=True, exist_ok=True)
    if bare in STARTS:
        base, recipe = STARTS[bare]
        return build_start_checkpoint(output_dir, str(resolve_model_path(BUILTIN_PREFIX + base)), recipe)
    UNTRAINED_BUILDERS[bare](output_dir)
    return output_dir
