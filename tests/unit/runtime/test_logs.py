"""The engines' log lines follow --log-level: vLLM's INFO lines and its benign warnings only at debug."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator

import pytest

from runtime.logs import setup_logging

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
ENV_KEYS = ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY", "TORCH_CPP_LOG_LEVEL")


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in ("vllm", "transformers", "httpx", "httpcore")}
    vllm_logger = logging.getLogger("vllm")
    vllm_handlers, vllm_propagate = vllm_logger.handlers[:], vllm_logger.propagate
    for key in ENV_KEYS:
        monkeypatch.setenv(key, os.environ.get(key, "unset"))  # restored afterwards, whatever setup_logging sets
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)
    vllm_logger.handlers[:], vllm_logger.propagate = vllm_handlers, vllm_propagate


def shown(level: str) -> str:
    setup_logging(level)
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    logging.getLogger(RELOAD_LOGGER).warning("%s: Failed to load weights", "RotaryEmbedding")
    logging.getLogger(RELOAD_LOGGER).warning("%s: Failed to load weights", "QKVParallelLinear")
    logging.getLogger("vllm.config.model").info("Resolved architecture: Qwen2ForCausalLM")
    logging.getLogger("vllm.renderers.base").warning("Chat template warmup failed", exc_info=ValueError("no tokenizer"))
    logging.getLogger("worker.join").info("1 vllm engine(s) ready on policy v0")
    return stream.getvalue()


@pytest.mark.usefixtures("restore_logging")
def test_default_level_shows_vllm_warnings_that_matter_only() -> None:
    text = shown("info")
    assert "QKVParallelLinear: Failed to load weights" in text  # a layer that should have loaded: it matters
    assert "engine(s) ready" in text
    assert "RotaryEmbedding" not in text and "Resolved architecture" not in text
    assert "Chat template" not in text and "Traceback" not in text
    assert os.environ["VLLM_CONFIGURE_LOGGING"] == "0" and os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"


@pytest.mark.usefixtures("restore_logging")
def test_debug_level_shows_every_vllm_line() -> None:
    text = shown("debug")
    for line in ("RotaryEmbedding: Failed", "QKVParallelLinear: Failed", "Resolved architecture", "Chat template"):
        assert line in text
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG" and os.environ["TRANSFORMERS_VERBOSITY"] == "info"


@pytest.mark.usefixtures("restore_logging")
def test_error_level_hides_vllm_warnings() -> None:
    text = shown("error")
    assert "Failed to load weights" not in text and "engine(s) ready" not in text
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"


@pytest.mark.usefixtures("restore_logging")
def test_vllm_lines_reach_the_root_handler_though_vllm_set_up_its_own_first() -> None:
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(logging.StreamHandler(io.StringIO()))
    vllm_logger.propagate = False  # what vLLM's own logging set-up does when it ran first in this process
    text = shown("info")
    assert "QKVParallelLinear: Failed to load weights" in text and "RotaryEmbedding" not in text


@pytest.mark.usefixtures("restore_logging")
def test_other_parties_text_reaches_the_console_escaped_on_one_line() -> None:
    """A reason or an environment's error carries escapes and line breaks: shown escaped, it can neither clear,
    retitle or recolour the terminal nor forge a line of its own; a traceback keeps its lines."""
    setup_logging("info")
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    reason = "bad\x1b[2J\x1b]0;title\x07\r\n12:00:00 INFO  validator: accepted s-1\u202e\x9b31m\tend"
    logging.getLogger("validator").warning("environment error on s-0: %s", reason)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("validator").exception("it failed")
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith(
        "environment error on s-0: bad\\x1b[2J\\x1b]0;title\\x07\\r\\n12:00:00 INFO  validator: accepted s-1"
        "\\u202e\\x9b31m\tend"
    ), first
    assert rest[0].endswith("it failed") and rest[1] == "Traceback (most recent call last):", rest
