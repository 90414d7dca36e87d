"""Logging set-up shared by every command: one line per event, human or JSON.

Human lines read ``12:00:01 INFO  worker: leased task t-12 (policy v3)``; with ``--json-logs``
each line is one JSON object (``ts``, ``level``, ``logger``, ``event`` plus any ``extra``
fields passed to the log call), for machines that collect logs; the error a command stops on is
then one such object too (:func:`fatal_json_line`, logger ``exit``, with its ``exit_code``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
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


class HumanFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<5} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "info", json_logs: bool = False) -> None:
    """Route all logging to stderr, one line per event."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
