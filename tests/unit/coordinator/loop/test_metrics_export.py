"""`prime-coordinator metrics export`: rows as CSV or JSON lines; a run that is not there is refused in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from coordinator.cli import app
from coordinator.loop.metrics_export import render

ROWS = [
    {"kind": "step", "step": 1, "at": 10.0, "loss": 0.5, "batch_rewards": {"exact": 1.0}},
    {"kind": "step", "step": 2, "at": 20.0, "loss": 0.25, "grad_norm": 1.5},
    {"kind": "eval", "step": 0, "at": 5.0, "eval_accuracy": 0.0},
]


def test_jsonl_is_one_row_a_line() -> None:
    assert [json.loads(line) for line in render(ROWS, "jsonl").splitlines()] == ROWS


def test_csv_has_a_column_per_key_and_empty_cells_where_a_row_lacks_one() -> None:
    table = list(csv.DictReader(render(ROWS, "csv").splitlines()))
    assert list(table[0]) == ["kind", "step", "at", "batch_rewards", "eval_accuracy", "grad_norm", "loss"]
    assert table[0]["batch_rewards"] == '{"exact": 1.0}' and table[0]["grad_norm"] == ""
    assert [(r["kind"], r["step"], r["loss"]) for r in table] == [
        ("step", "1", "0.5"),
        ("step", "2", "0.25"),
        ("eval", "0", ""),
    ]


def test_a_run_without_a_ledger_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["metrics", "export", "--data-dir", str(tmp_path / "nothing")])
    assert result.exit_code != 0
    assert "no ledger at" in result.output


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["metrics", "export", "--data-dir", str(tmp_path), "--format", "xlsx"])
    assert result.exit_code != 0 and "choose csv or jsonl" in result.output
