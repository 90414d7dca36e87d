"""The run's metrics file: one JSON line per trained step and one per eval, kept for the whole run.

``<data_dir>/metrics.jsonl`` is what a person (or a plotting script) reads after a run: a ``step`` row
per trained step (the trainer's loss, entropy, grad norm, mismatch KL ... and the batch's
``batch_*`` figures: reward, reward by component, completion length, stop and truncated fractions,
staleness) and an ``eval`` row per eval of a published policy (``eval_*``; see
:mod:`coordinator.loop.evals`). Every row carries ``kind``, ``step`` and ``at`` (Unix time). The
ledger holds the same figures (``train_steps.metrics_json``); this file is their projection, so a
restarted coordinator writes the rows it finds missing (:meth:`RunMetricsFile.sync`) and never one
twice. A line cut short by a crash is dropped when the file is opened again. Each row written is
also handed to the run's trackers (:mod:`coordinator.loop.tracking`: TensorBoard, W&B) when any
are configured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from coordinator.ledger.train_steps import StepRecord

METRICS_FILE = "metrics.jsonl"
EVAL_PREFIX = "eval_"
"""Keys of a step's metrics that come from the eval of its policy, not from its training."""
RowKind = Literal["step", "eval"]


class RowSink(Protocol):
    """Where a copy of each row goes once it is in the file (:class:`coordinator.loop.tracking.Trackers`)."""

    def log(self, kind: RowKind, step: int, values: Mapping[str, Any]) -> None: ...


def step_values(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A step's training metrics: everything but its eval's."""
    return {k: v for k, v in metrics.items() if not k.startswith(EVAL_PREFIX)}


def eval_values(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The eval figures among a step's metrics (empty when its policy was not evaluated)."""
    return {k: v for k, v in metrics.items() if k.startswith(EVAL_PREFIX)}


def _drop_torn_tail(path: Path) -> None:
    """Cut the file after its last newline: a row half written when the process died is not a row."""
    with path.open("rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


class RunMetricsFile:
    """Appends rows to ``path``; knows which (kind, step) rows it already holds."""

    def __init__(self, path: Path, sink: RowSink | None = None) -> None:
        self.path = path
        self.sink = sink
        self._written: set[tuple[str, int]] = set()
        if path.is_file():
            _drop_torn_tail(path)
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    self._written.add((str(row.get("kind")), row["step"]))

    def has(self, kind: RowKind, step: int) -> bool:
        return (kind, step) in self._written

    def append(self, kind: RowKind, step: int, at: float, values: Mapping[str, Any]) -> bool:
        """Write the row unless the file holds it already; True when written."""
        if self.has(kind, step):
            return False
        row = {"kind": kind, "step": step, "at": at, **values}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._written.add((kind, step))
        if self.sink is not None:
            self.sink.log(kind, step, values)
        return True

    def sync(self, records: Iterable[StepRecord], at: float) -> int:
        """Write the rows of trained steps (and their evals) that the ledger has and the file lacks; how many."""
        written = 0
        for record in records:
            if record.state == "recorded" or not record.metrics:
                continue
            written += self.append("step", record.step, at, step_values(record.metrics))
            found = eval_values(record.metrics)
            if found:
                written += self.append("eval", record.step, at, found)
        return written
