"""`prime-coordinator metrics export`: every trained step's metrics and every eval, from the run's ledger.

The ledger is the source of truth: ``metrics.jsonl`` in the data dir is its projection (see
:mod:`coordinator.loop.run_metrics`), and the ledger is there even when the file was removed or the
run was trained before the file existed. A ``step`` row comes from each trained step's record
(``train_steps.metrics_json`` without its ``eval_*`` figures, ``at`` its training time): the trainer's
loss, entropy, mismatch KL, grad norm ... and the batch's ``batch_*`` figures. An ``eval`` row comes
from each ``evaluated`` event of the log (``at`` its time; v0, the start policy, has no step record);
an eval whose event was moved to the archive is still exported from its step's record, at the
step's publication time. The rows have the shape of ``metrics.jsonl``'s: ``kind``, ``step``, ``at``
and the figures, steps first in step order, then evals in step order. CSV puts one row per line
with a column per key (the union over rows; empty where a row lacks it).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from coordinator.config import CoordinatorConfig
from coordinator.ledger.archive import open_existing
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.train_steps import trained_steps_and_evals
from coordinator.loop.run_metrics import eval_values, step_values

MetricsFormat = Literal["csv", "jsonl"]
LEADING_COLUMNS = ("kind", "step", "at")


def metrics_rows(db: Database) -> list[dict[str, Any]]:
    """The run's ``step`` and ``eval`` rows, as :mod:`coordinator.loop.run_metrics` writes them."""
    steps, logged = trained_steps_and_evals(db)
    rows: list[dict[str, Any]] = []
    evals: dict[int, dict[str, Any]] = {}
    for event in logged:
        data = json.loads(event.data_json)
        subject = event.subject or ""
        if data.get("state") == "evaluated" and subject.isdigit() and isinstance(data.get("metrics"), dict):
            evals.setdefault(int(subject), {"kind": "eval", "step": int(subject), "at": event.at, **data["metrics"]})
    for step in steps:
        metrics = json.loads(step.metrics_json) if step.metrics_json else {}
        if not metrics:
            continue
        rows.append({"kind": "step", "step": step.step, "at": step.trained_at, **step_values(metrics)})
        archived = eval_values(metrics)
        if archived and step.step not in evals:
            evals[step.step] = {"kind": "eval", "step": step.step, "at": step.published_at, **archived}
    return rows + [evals[step] for step in sorted(evals)]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def render(rows: Iterable[dict[str, Any]], fmt: MetricsFormat) -> str:
    """The rows as JSON lines, or as CSV with a header of every key (``kind``, ``step``, ``at`` first)."""
    rows = list(rows)
    if fmt == "jsonl":
        return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    keys = sorted({key for row in rows for key in row} - set(LEADING_COLUMNS))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*LEADING_COLUMNS, *keys], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _cell(value) for key, value in row.items()})
    return out.getvalue()


def export_metrics_from_cli(config: CoordinatorConfig, fmt: MetricsFormat, output: Path | None) -> None:
    """Write the run's metrics to ``output`` (replaced whole once complete) or to stdout."""
    db = open_existing(config)
    try:
        rows = metrics_rows(db)
    finally:
        db.dispose()
    text = render(rows, fmt)
    num_steps = sum(1 for row in rows if row["kind"] == "step")
    summary = f"{num_steps} step row(s) and {len(rows) - num_steps} eval row(s) of run {config.run_name!r}"
    if output is None:
        sys.stdout.write(text)
        print(f"exported {summary} ({fmt})", file=sys.stderr)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(output)
    print(f"exported {summary} to {output} ({fmt})")
