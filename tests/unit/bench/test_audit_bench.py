"""The audit bench's cheating workers: which samples each strategy copies, and the log the bench counts them by."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from bench.audit_bench import parse_args
from engines.base import GenerationRequest, GenerationResult
from tests.support.cheating_worker import CheatingEngine


class Generated:
    """An engine that answers each request with its own token (the sample's index) and counts what it generated."""

    name = "hf"

    def __init__(self) -> None:
        self.generated = 0

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.generated += len(requests)
        return [
            GenerationResult(r.uid, [int(r.uid.rsplit("/", 1)[1])], [-1.0], "length", torch.zeros(1, 4))
            for r in requests
        ]


def _task(task_id: str, size: int = 4) -> list[GenerationRequest]:
    return [GenerationRequest(f"{task_id}/0/{i}", [1, 2], 8, 1.0, 7, i) for i in range(size)]


def _engine(strategy: str, tmp_path: Path, **kwargs: Any) -> tuple[CheatingEngine, Generated]:
    inner = Generated()
    options = {"record_tasks": 2, "rate": 0.5, "seed": 0} | kwargs
    engine = CheatingEngine(inner, strategy, tmp_path / "cheats.jsonl", "node-a", **options)  # type: ignore[arg-type]
    return engine, inner


def test_always_copies_every_sample_but_the_first_and_logs_them(tmp_path: Path) -> None:
    engine, inner = _engine("always", tmp_path)
    results = engine.generate(_task("t-1") + _task("t-2"))
    assert inner.generated == 2  # one sample of each task generated
    assert [r.completion_ids for r in results] == [[0]] * 8
    assert [r.uid for r in results] == [r.uid for r in _task("t-1") + _task("t-2")]
    logged = [json.loads(line) for line in (tmp_path / "cheats.jsonl").read_text().splitlines()]
    assert [(e["node_id"], e["task_id"], len(e["uids"])) for e in logged] == [
        ("node-a", "t-1", 3),
        ("node-a", "t-2", 3),
    ]


def test_record_is_honest_first_then_copies_one_sample_per_task(tmp_path: Path) -> None:
    engine, inner = _engine("record", tmp_path)
    for index in range(4):
        engine.generate(_task(f"t-{index}"))
    assert inner.generated == 4 + 4 + 3 + 3
    logged = [json.loads(line)["task_id"] for line in (tmp_path / "cheats.jsonl").read_text().splitlines()]
    assert logged == ["t-2", "t-3"]


def test_honest_and_rarely(tmp_path: Path) -> None:
    honest, inner = _engine("honest", tmp_path)
    honest.generate(_task("t-0", 8))
    assert inner.generated == 8 and not (tmp_path / "cheats.jsonl").exists()
    rarely, inner = _engine("rarely", tmp_path, rate=0.5)
    for index in range(40):
        rarely.generate(_task(f"t-{index}"))
    cheated = 40 * 4 - inner.generated
    assert 10 <= cheated <= 30  # about half the tasks, one sample each


def test_quick_is_short_and_the_defaults_are_the_demo_s() -> None:
    assert parse_args(["--quick"]).steps == 8
    args = parse_args([])
    assert (args.steps, args.full_audit_results, args.floor, args.reaudit_share) == (40, 10, 0.05, 0.05)
