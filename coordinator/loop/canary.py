"""The canary: an eval that falls past the eval's noise rolls the run back to its best evaluated policy.

Every eval the loop runs (``orchestrator.eval_every_steps``) is compared with the best one so far of a version no
rollback undid. A policy whose held-out accuracy ``a`` (of ``n`` examples) is below the best's ``b`` (of ``m``) by
more than ``noise_z`` standard errors of the difference, ``z * sqrt(p (1 - p) (1/n + 1/m))`` with ``p`` the two
evals' pooled accuracy (:func:`fall_margin`), asks for a rollback to the best version
(:class:`~coordinator.ledger.train_steps.RollbackRequest`): the RL loop's next step publishes that version's weights
again as a new version number, and the steps since are marked rolled back. At 128 examples and an accuracy near 0.5
the margin at z = 3 is 0.19; an honest run whose accuracy only wobbles stays well inside it.

The best version's weights are kept apart (hard links to its eval's copy, ``<data_dir>/canary/best``), because the
loop prunes published step files and the origin store keeps only the newest versions. A rollback, by this rule or
by ``prime-coordinator rollback``, restores from a copy made when it is asked for (:func:`keep_for_rollback`), so
nothing pruned later can take its weights away.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.ledger.train_steps import RollbackRequest, TrainSteps
from coordinator.loop.evals import link_tree
from protocol.errors import ConfigError
from shardcast.format.store import VersionStore
from shardcast.origin.publish import checkpoint_dir_of

log = logging.getLogger("coordinator.loop.canary")

BEST_DIR = "best"
BEST_FILE = "best.json"


def fall_margin(best: float, best_n: int, accuracy: float, n: int, z: float) -> float:
    """How far below ``best`` (of ``best_n`` examples) an accuracy of ``n`` examples may be before it is a fall:
    ``z`` standard errors of the difference of the two proportions, pooled."""
    pooled = (best * best_n + accuracy * n) / (best_n + n)
    return z * math.sqrt(max(0.0, pooled * (1 - pooled)) * (1 / best_n + 1 / n))


@dataclass(frozen=True)
class Best:
    version: int
    accuracy: float
    num_examples: int


def rollback_dir(config: CoordinatorConfig) -> Path:
    """Where the weights a rollback restores are kept until it is published."""
    return config.data_dir / "rollback"


def keep_for_rollback(config: CoordinatorConfig, version: int, source: Path) -> Path:
    """A copy (hard links) of version ``version``'s weights at ``source`` that the rollback restores from."""
    target = rollback_dir(config) / f"v{version}"
    link_tree(source, target)
    return target


def rollback_source(config: CoordinatorConfig, store: VersionStore, version: int) -> Path:
    """Where version ``version``'s weights are still kept: the canary's best, or the origin store; ConfigError saying
    which versions are kept when it is neither."""
    best = kept_best(config)
    if best is not None and best.version == version:
        return canary_dir(config) / BEST_DIR
    if version in store.versions():
        return checkpoint_dir_of(store, version)
    held = ", ".join(f"v{v}" for v in sorted(store.versions())) or "none"
    canary = f"; the canary keeps v{best.version}" if best is not None else ""
    raise ConfigError(f"the weights of v{version} are no longer kept: the origin store holds {held}{canary}")


def canary_dir(config: CoordinatorConfig) -> Path:
    return config.data_dir / "canary"


def kept_best(config: CoordinatorConfig) -> Best | None:
    """The best evaluated version whose weights the canary keeps, or None."""
    path = canary_dir(config) / BEST_FILE
    if not path.is_file() or not (canary_dir(config) / BEST_DIR).is_dir():
        return None
    value = json.loads(path.read_text())
    return Best(int(value["version"]), float(value["accuracy"]), int(value["num_examples"]))


class Canary:
    """Compares each eval with the best so far; keeps the best version's weights; asks for rollbacks."""

    def __init__(self, config: CoordinatorConfig, steps: TrainSteps) -> None:
        self.config = config
        self.settings = config.orchestrator.canary
        self.steps = steps
        self.best = kept_best(config)

    def _keep(self, version: int, figures: dict[str, float], model_dir: Path) -> None:
        folder = canary_dir(self.config)
        staging = folder / f".{BEST_DIR}.partial"
        link_tree(model_dir, staging)
        shutil.rmtree(folder / BEST_DIR, ignore_errors=True)
        staging.replace(folder / BEST_DIR)
        self.best = Best(version, figures["eval_accuracy"], int(figures["eval_num_examples"]))
        value = {"version": version, "accuracy": self.best.accuracy, "num_examples": self.best.num_examples}
        (folder / BEST_FILE).write_text(json.dumps(value))

    def on_eval(self, version: int, figures: dict[str, float], model_dir: Path) -> RollbackRequest | None:
        """Take the eval of ``version`` (its policy at ``model_dir``, about to be removed); the rollback to ask for
        when it fell, else None."""
        if not self.settings.enabled or self._undone(version) or self.steps.rollback_request() is not None:
            return None
        accuracy, n = figures["eval_accuracy"], int(figures["eval_num_examples"])
        best = self.best
        if best is None or accuracy > best.accuracy:
            self._keep(version, figures, model_dir)
            return None
        margin = fall_margin(best.accuracy, best.num_examples, accuracy, n, self.settings.noise_z)
        if best.accuracy - accuracy <= margin or version <= best.version:
            return None
        reason = (
            f"the eval of v{version} (accuracy {accuracy:.3f}) fell below v{best.version}'s ({best.accuracy:.3f}) by "
            f"more than {self.settings.noise_z:g} standard errors ({margin:.3f})"
        )
        source = keep_for_rollback(self.config, best.version, canary_dir(self.config) / BEST_DIR)
        return RollbackRequest(
            to_version=best.version,
            reason=reason,
            lr_scale=self.settings.lr_scale,
            pause=self.settings.action == "pause",
            source_dir=str(source),
        )

    def _undone(self, version: int) -> bool:
        record = self.steps.step(version)
        return record is not None and record.rolled_back
