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
