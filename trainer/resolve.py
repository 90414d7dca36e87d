"""Every model name a config may give, resolved to a local checkpoint directory, built-ins built on first use.

A name is a local HF checkpoint directory, ``builtin:tiny-qwen2`` (random weights,
:mod:`trainer.builtin`) or ``builtin:tiny-qwen2-reverse-start`` (the demo's RL start, an early
SFT of tiny-qwen2: :mod:`trainer.start`). Entry points (the CLIs, the coordinator, benches)
resolve names here before a trainer or an engine loads them; :mod:`trainer.model` sits below
the trainer and only loads directories and built-ins already built, so loading a model never
runs SFT.
"""

from __future__ import annotations

from pathlib import Path

from trainer.builtin import BUILTIN_PREFIX, REVERSE_START, TINY_QWEN2, Builder, build_random_qwen2
from trainer.builtin import resolve_model_path as resolve_with
from trainer.start import build_start_checkpoint


def _build_reverse_start(output_dir: Path) -> None:
    base = resolve_with(BUILTIN_PREFIX + TINY_QWEN2, output_dir.parent)
    build_start_checkpoint(output_dir, str(base))


BUILDERS: dict[str, Builder] = {TINY_QWEN2: build_random_qwen2, REVERSE_START: _build_reverse_start}


def resolve_model_path(name: str, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory of ``name``; a built-in is built in the cache dir on first use."""
    return resolve_with(name, cache_dir, BUILDERS)
