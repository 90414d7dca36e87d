"""Per-step metrics: one JSON object per line in a file, and one human line on the console.

Only rank 0 writes. W&B is optional: when ``wandb_project`` is given and the ``wandb``
package is importable, the same records are logged there too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger("trainer.metrics")

CONSOLE_KEYS = ("loss", "reward_mean", "entropy", "mismatch_kl", "grad_norm", "lr", "tokens_per_s")


def format_metrics(record: dict[str, Any]) -> str:
    parts = [f"step {record.get('step', '?')}"]
    keys = [*CONSOLE_KEYS, *(k for k in sorted(record) if k.startswith("eval_"))]
    for key in keys:
        value = record.get(key)
        if isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
    return " | ".join(parts)


class MetricsLogger:
    """Appends records to ``path`` (JSONL) and logs a summary line (every ``console_every``); no-op off rank 0."""

    def __init__(
        self, path: Path | None, enabled: bool = True, wandb_project: str | None = None, console_every: int = 1
    ) -> None:
        self.enabled = enabled
        self.console_every = console_every
        self._count = 0
        self._file = None
        self._wandb: Any = None
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")
        if enabled and wandb_project:
            try:
                import wandb
            except ImportError:
                log.warning("wandb_project=%s given but wandb is not installed; logging to JSONL only", wandb_project)
            else:
                self._wandb = wandb.init(project=wandb_project)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._file is not None:
            self._file.write(json.dumps(record, sort_keys=True) + "\n")
            self._file.flush()
        if self._wandb is not None:
            self._wandb.log(record, step=record.get("step"))
        self._count += 1
        if self._count % self.console_every == 0 or "step" not in record:
            log.info(format_metrics(record))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
