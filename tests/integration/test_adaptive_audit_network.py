"""Adaptive audit through the real network: the demo's run (`prime-coordinator start` with its local HF worker,
validator and trainer) with `[validation.adaptive]`, one more honest worker and three cheating ones
(tests/support/cheating_worker.py, started as bench/audit_bench.py starts them).

Honest workers' submissions are recomputed whole until their record, then in shrinking shares; the
cheater of every task is caught on its first audits and banned, none of its samples trained; honest
work is never rejected; re-audits of accepted work happen and pass for honest workers.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bench.audit_bench import node_id_of, parse_args, run_network

pytestmark = pytest.mark.slow


def test_records_shrink_the_recomputed_share_and_cheaters_are_caught(tmp_path: Path) -> None:
    short = "--steps 4 --groups-per-step 8 --prompts-per-task 4 --full-audit-results 2 --floor 0.1 --reaudit-share 0.5"
    args = parse_args([*short.split(), "--record-tasks", "4", "--rate", "0.3"])
    run = run_network(tmp_path, "adaptive", args)
    by = run["by_strategy"]
    assert run["honest_rejections"] == 0, by
    assert by["always"]["banned"] and by["always"]["trained_cheated_samples"] == 0, by
    assert by["always"]["cheated_rejected"] >= 3
    assert by["honest"].get("reaudits_passed", 0) + by["honest-local"].get("reaudits_passed", 0) > 0, by

    honest = node_id_of(tmp_path / "workers" / "honest")
    with sqlite3.connect(tmp_path / "run" / "ledger.db") as db:
        shares = [
            share
            for (share,) in db.execute(
                "SELECT audit_share FROM submissions WHERE node_id = ? ORDER BY submitted_at", (honest,)
            )
        ]
    assert len(shares) > 4 and shares[:2] == [1.0, 1.0], shares  # whole until 2 accepted in a row
    assert min(shares) < 0.5, shares  # then 1 / record, down to the floor
