"""Optional copies of the run's metrics rows in TensorBoard and Weights & Biases (``[orchestrator.tracking]``).

Every row :class:`~coordinator.loop.run_metrics.RunMetricsFile` writes to ``metrics.jsonl`` is handed
to the trackers configured here, the same values at the same step: a ``step`` row's figures as
``train/<key>`` and an ``eval`` row's as ``eval/<key>`` (``eval_accuracy`` becomes ``eval/accuracy``),
numbers only. TensorBoard gets scalars at ``global_step`` = the step, in ``tensorboard_dir``
(default ``<data_dir>/tensorboard``); W&B gets ``train/step`` and ``eval/step`` as each series' own
step axis, since an eval may finish after later steps were trained. Both packages are optional and
imported only when switched on: :func:`check_tracking` names the ``pip install`` that brings a
missing one before the run starts. A restarted coordinator continues the same W&B run (its id is
kept in the data dir) and appends to the same TensorBoard directory; rows ``metrics.jsonl`` already
held before a restart are not sent again.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from coordinator.config import TrackingConfig, WandbConfig
from coordinator.loop.run_metrics import RowKind
from protocol.errors import StartupError

log = logging.getLogger("coordinator.tracking")

TRACKING_EXTRA = "pip install 'prime-network[tracking]'"
WANDB_ID_FILE = "wandb-run-id"


class Tracker(Protocol):
    def log(self, kind: RowKind, step: int, values: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def _missing(package: str, setting: str) -> StartupError:
    return StartupError(f"{setting} needs the {package} package, which is not installed", TRACKING_EXTRA)


def check_tracking(config: TrackingConfig) -> None:
    """Refuse to start (one line naming the ``pip install``) when a tracker is on and its package is missing."""
    if config.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise _missing("tensorboard", "orchestrator.tracking.tensorboard")
    if config.wandb.mode != "disabled" and importlib.util.find_spec("wandb") is None:
        raise _missing("wandb", f"orchestrator.tracking.wandb.mode = {config.wandb.mode!r}")


def scalars(kind: RowKind, values: Mapping[str, Any]) -> dict[str, float]:
    """The row's finite numbers under their tracker names (``train/loss``, ``eval/accuracy``)."""
    found = {}
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            name = key.removeprefix("eval_") if kind == "eval" else key
            found[f"{'train' if kind == 'step' else 'eval'}/{name}"] = float(value)
    return found


class TensorBoardTracker:
    """Scalars in a TensorBoard event file (through torch's SummaryWriter, which needs the tensorboard package)."""

    def __init__(self, logdir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _missing("tensorboard", "orchestrator.tracking.tensorboard") from exc
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        self._writer = SummaryWriter(log_dir=str(logdir))

    def log(self, kind: RowKind, step: int, values: Mapping[str, Any]) -> None:
        for tag, value in scalars(kind, values).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """One W&B run per run directory: its id is kept in ``data_dir/wandb-run-id`` so a restart resumes it."""

    def __init__(self, config: WandbConfig, run_name: str, data_dir: Path, run_config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise _missing("wandb", f"orchestrator.tracking.wandb.mode = {config.mode!r}") from exc
        id_file = data_dir / WANDB_ID_FILE
        if id_file.is_file():
            run_id = id_file.read_text(encoding="utf-8").strip()
        else:
            run_id = f"{run_name[:40]}-{secrets.token_hex(4)}"
            data_dir.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n", encoding="utf-8")
        root = config.dir or data_dir
        root.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=config.project,
            entity=config.entity,
            mode=config.mode,
            dir=str(root),
            name=run_name,
            id=run_id,
            resume="allow",
            config=dict(run_config),
        )
        for series in ("train", "eval"):
            self._run.define_metric(f"{series}/step")
            self._run.define_metric(f"{series}/*", step_metric=f"{series}/step")

    def log(self, kind: RowKind, step: int, values: Mapping[str, Any]) -> None:
        row = scalars(kind, values)
        row[f"{'train' if kind == 'step' else 'eval'}/step"] = step
        self._run.log(row)

    def close(self) -> None:
        self._run.finish()


class Trackers:
    """The configured trackers together; a tracker that fails to log is reported once and dropped, never the run."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log(self, kind: RowKind, step: int, values: Mapping[str, Any]) -> None:
        for tracker in list(self.trackers):
            try:
                tracker.log(kind, step, values)
            except Exception as exc:  # a full disk or a W&B outage must not stop the training
                log.error("%s stopped logging metrics: %s", type(tracker).__name__, exc)
                self.trackers.remove(tracker)

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:
                log.warning("%s did not close cleanly: %s", type(tracker).__name__, exc)
        self.trackers = []


def open_trackers(
    config: TrackingConfig, run_name: str, data_dir: Path, run_config: Mapping[str, Any] | None = None
) -> Trackers:
    """The trackers ``config`` switches on (none: an empty :class:`Trackers`)."""
    found: list[Tracker] = []
    if config.tensorboard:
        logdir = config.tensorboard_dir or data_dir / "tensorboard"
        found.append(TensorBoardTracker(logdir))
        log.info("TensorBoard scalars of every step in %s (tensorboard --logdir %s)", logdir, logdir)
    if config.wandb.mode != "disabled":
        found.append(WandbTracker(config.wandb, run_name, data_dir, run_config or {}))
        log.info("W&B logging (%s) to project %s", config.wandb.mode, config.wandb.project)
    return Trackers(found)
