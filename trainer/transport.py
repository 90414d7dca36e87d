"""The filesystem transport between the orchestrator and the trainer service (like prime-rl's).

Everything lives under one directory (``<data_dir>/train``): the orchestrator writes
``batches/step_<n>.json`` (the samples of step n, with advantages); the trainer ranks read
it, train, export the policy to ``policies/step_<n>/``, save the trainer state under
``checkpoints/`` and write ``done/step_<n>.json`` (the step's metrics) last. Every file is
written to a temporary name and renamed, so a reader never sees half of one and a crash
leaves either the whole file or none.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainer.packing import TrainSample


@dataclass(frozen=True)
class StepBatch:
    """One step's batch as the trainer receives it."""

    step: int
    samples: list[TrainSample]
    temperature: float
    submission_ids: list[str]


def write_json_atomic(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as handle:
        json.dump(value, handle, separators=(",", ":"))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file (yet)."""
    if not path.is_file():
        return None
    value: dict[str, Any] = json.loads(path.read_text())
    return value


class TrainDir:
    """Paths and files of the transport under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def log_path(self) -> Path:
        return self.root / "trainer.log"

    def batch_path(self, step: int) -> Path:
        return self.root / "batches" / f"step_{step}.json"

    def policy_dir(self, step: int) -> Path:
        return self.root / "policies" / f"step_{step}"

    def done_path(self, step: int) -> Path:
        return self.root / "done" / f"step_{step}.json"

    def write_batch(self, batch: StepBatch) -> None:
        value = {
            "step": batch.step,
            "temperature": batch.temperature,
            "submission_ids": batch.submission_ids,
            "samples": [asdict(sample) for sample in batch.samples],
        }
        write_json_atomic(self.batch_path(batch.step), value)

    def read_batch(self, step: int) -> StepBatch | None:
        path = self.batch_path(step)
        if not path.is_file():
            return None
        value = json.loads(path.read_text())
        return StepBatch(
            step=int(value["step"]),
            samples=[TrainSample(**sample) for sample in value["samples"]],
            temperature=float(value["temperature"]),
            submission_ids=list(value["submission_ids"]),
        )

    def write_done(self, step: int, metrics: dict[str, Any]) -> None:
        write_json_atomic(self.done_path(step), metrics)

    def read_done(self, step: int) -> dict[str, Any] | None:
        return read_json_object(self.done_path(step))

    def metrics_path(self, step: int) -> Path:
        return self.root / "metrics" / f"step_{step}.json"

    def write_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """The step's metrics, kept before its checkpoint so a done marker lost in a crash can be rewritten."""
        write_json_atomic(self.metrics_path(step), metrics)

    def read_metrics(self, step: int) -> dict[str, Any] | None:
        return read_json_object(self.metrics_path(step))

    def staging_policy_dir(self, step: int) -> Path:
        return self.root / "policies" / f".step_{step}.partial"

    def install_policy(self, step: int) -> Path:
        """Move a fully exported policy from its staging name to ``policy_dir(step)`` (rank 0)."""
        target = self.policy_dir(step)
        if target.exists():
            shutil.rmtree(target)
        self.staging_policy_dir(step).replace(target)
        return target
