"""Models by their hub id (ORG/NAME[@REVISION]) resolve through huggingface_hub's cache, offline here."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest

from protocol.errors import ConfigError
from tests.support.hub_cache import fill_hub_cache
from tests.support.tiny_model import save_tiny_model
from trainer.builtin import is_hub_id
from trainer.resolve import resolve_model_path


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_hub_id_resolves_to_its_cached_snapshot(tmp_path: Path, offline_cache: Path) -> None:
    snapshot = fill_hub_cache(offline_cache, "test-org/tiny-policy", save_tiny_model(tmp_path / "ckpt"))
    assert resolve_model_path("test-org/tiny-policy") == snapshot
    assert resolve_model_path(f"test-org/tiny-policy@{'a' * 40}") == snapshot  # a pinned revision
    assert (snapshot / "config.json").is_symlink()  # as in a real cache


def test_a_hub_id_missing_offline_says_how_to_get_it(offline_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"not in the Hugging Face cache.*huggingface-cli download Qwen/Qwen3-0.6B"):
        resolve_model_path("Qwen/Qwen3-0.6B")


def test_local_directories_win_and_junk_is_no_hub_id(tmp_path: Path, offline_cache: Path) -> None:
    local = save_tiny_model(tmp_path / "org" / "model")
    assert resolve_model_path(str(local)) == local
    assert is_hub_id("Qwen/Qwen3-0.6B") and is_hub_id("meta-llama/Llama-3.2-1B@main")
    assert not is_hub_id("/data/my-qwen") and not is_hub_id("a/b/c") and not is_hub_id("../x/y")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nowhere" / "model"))
