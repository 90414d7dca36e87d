"""Fixtures of the trainer tests: the session's built-in model cache, one torch thread."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def builtin_dir() -> Path:
    """The session's built-in cache (``PRIME_BUILTIN_DIR``, made empty by tests/conftest.py for the whole run)."""
    return Path(os.environ["PRIME_BUILTIN_DIR"])


@pytest.fixture(scope="session")
def tiny_model_dir(builtin_dir: Path) -> Path:
    from trainer.resolve import resolve_model_path

    return resolve_model_path("builtin:tiny-qwen2")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread per test: on a shared 2-core machine OpenMP oversubscription makes
    tiny-model steps several times slower; the tests check numbers, not speed."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
