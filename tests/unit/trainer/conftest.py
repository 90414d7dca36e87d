"""Fixtures of the trainer tests: a private built-in model cache built once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def builtin_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh built-in cache (PRIME_BUILTIN_DIR) for the whole session, so no test uses ~/.prime-network."""
    path = tmp_path_factory.mktemp("builtin")
    previous = os.environ.get("PRIME_BUILTIN_DIR")
    os.environ["PRIME_BUILTIN_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("PRIME_BUILTIN_DIR", None)
    else:
        os.environ["PRIME_BUILTIN_DIR"] = previous


@pytest.fixture(scope="session")
def tiny_model_dir(builtin_dir: Path) -> Path:
    from trainer.builtin import resolve_model_path

    return resolve_model_path("builtin:tiny-qwen2")
