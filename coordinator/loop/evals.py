"""Evals during training: a published policy on the environment's eval split, beside the RL loop.

With ``orchestrator.eval_every_steps = N`` (> 0) the start policy (v0) and every N-th published
policy (and the last) are evaluated (:func:`eval_due`). :class:`PolicyEvals` keeps a queue and runs
one eval at a time as a child process, ``prime-trainer eval`` (:mod:`trainer.rollout`'s
``RolloutSampler.evaluate``: the HF engine, ``eval_num_examples`` examples of the eval split, one
sample each at the run's temperature and token budget, a fixed sampling seed so evals compare),
so the loop never waits for it. The step's policy directory is hard-linked into
``<data_dir>/evals/step_<n>/policy`` when it is queued, because the loop prunes published step
files; the copy goes when the eval ends. :meth:`PolicyEvals.poll` (called with the progress line)
collects a finished eval's report and hands ``eval_*`` figures (and the policy's copy, which the canary may keep)
to ``record``; a failed eval is a warning naming its log, never the end of the run.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.config import CoordinatorConfig
from runtime.children import Child, LogLimits
from runtime.config import config_to_toml
from trainer.config import EvalConfig
from trainer.transport import read_json_object

log = logging.getLogger("coordinator.loop.evals")

EVAL_SEED = 0
REPORT_KEYS = {
    "accuracy": "eval_accuracy",
    "reward_mean": "eval_reward_mean",
    "stop_fraction": "eval_stop_fraction",
    "mean_completion_tokens": "eval_completion_tokens_mean",
    "num_examples": "eval_num_examples",
    "num_samples": "eval_num_samples",
}
"""``prime-trainer eval`` report key -> the key it is recorded under with the step."""


def eval_due(step: int, every: int, num_steps: int) -> bool:
    """Whether policy v``step`` is evaluated: v0 (the start), every ``every``-th and the last; never when off."""
    return every > 0 and 0 <= step <= num_steps and (step % every == 0 or step == num_steps)


def eval_figures(report: object) -> dict[str, float] | None:
    """The recorded figures of an eval report, or None when it is not one (a field missing or not a number)."""
    if not isinstance(report, dict):
        return None
    figures: dict[str, float] = {}
    for source, key in REPORT_KEYS.items():
        value = report.get(source)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            return None
        figures[key] = float(value)
    return figures


def link_tree(source: Path, target: Path) -> None:
    """``target`` as a copy of ``source`` made of hard links (a plain copy where the filesystem has none)."""
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(source, target, copy_function=os.link)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)


@dataclass(frozen=True)
class QueuedEval:
    step: int
    model_dir: Path
    owned: bool
    """The model directory is this module's copy, removed when the eval ends."""


class PolicyEvals:
    """The queue of policies to evaluate and the one eval child running."""

    def __init__(
        self,
        config: CoordinatorConfig,
        record: Callable[[int, dict[str, float], Path], None],
        limits: LogLimits = LogLimits(),
    ) -> None:
        self.config = config
        self.record = record
        self.limits = limits
        self.root = config.data_dir / "evals"
        self.queue: deque[QueuedEval] = deque()
        self.running: tuple[QueuedEval, Child] | None = None

    def due(self, step: int) -> bool:
        settings = self.config.orchestrator
        return eval_due(step, settings.eval_every_steps, settings.num_steps)

    @property
    def idle(self) -> bool:
        return self.running is None and not self.queue

    def submit(self, step: int, model_dir: Path, copy: bool = True) -> None:
        """Queue the eval of policy v``step`` held in ``model_dir`` (copied now when the loop may prune it)."""
        if copy:
            target = self.root / f"step_{step}" / "policy"
            link_tree(model_dir, target)
            model_dir = target
        self.queue.append(QueuedEval(step, model_dir, copy))
        self.poll()

    def eval_config(self, model_dir: Path) -> EvalConfig:
        return EvalConfig(
            model=str(model_dir),
            environment=self.config.environment,
            num_examples=self.config.orchestrator.eval_num_examples,
            num_samples=1,
            temperature=self.config.scheduling.temperature,
            max_tokens=self.config.scheduling.max_tokens,
            seed=EVAL_SEED,
        )

    def _start(self, item: QueuedEval) -> Child:
        folder = self.root / f"step_{item.step}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.json").unlink(missing_ok=True)
        config_path = folder / "eval.toml"
        config_path.write_text(config_to_toml(self.eval_config(item.model_dir)))
        argv = [sys.executable, "-m", "trainer.cli", "eval", "--config", str(config_path)]
        argv += ["--output", str(folder / "report.json")]
        # one thread: the eval shares the machine with the trainer and the workers, and must not starve them
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        child = Child(f"eval-step-{item.step}", argv, folder / "eval.log", env=env, limits=self.limits)
        child.start()
        num_examples = self.config.orchestrator.eval_num_examples
        log.info("evaluating policy v%d on %d eval examples (log %s)", item.step, num_examples, child.log_path)
        return child

    def poll(self) -> None:
        """Collect a finished eval (record it, or warn), then start the next queued one."""
        if self.running is not None:
            item, child = self.running
            code = child.returncode
            if code is None:
                return
            self.running = None
            child.stop()  # joins its log pump
            self._finish(item, code, child.log_path)
        if self.queue:
            item = self.queue.popleft()
            self.running = (item, self._start(item))

    def _finish(self, item: QueuedEval, code: int, log_path: Path) -> None:
        report: Any = None
        with contextlib.suppress(ValueError):  # a torn or junk report is a failed eval
            report = read_json_object(self.root / f"step_{item.step}" / "report.json")
        figures = eval_figures(report) if code == 0 else None
        if figures is None:
            log.warning("the eval of policy v%d failed (exit code %d); see %s", item.step, code, log_path)
        else:
            self.record(item.step, figures, item.model_dir)
        if item.owned:
            shutil.rmtree(item.model_dir, ignore_errors=True)

    def stop(self) -> None:
        """Stop the running eval (the run is over or shutting down); the queue is dropped."""
        self.queue.clear()
        if self.running is not None:
            item, child = self.running
            self.running = None
            child.stop()
            if item.owned:
                shutil.rmtree(item.model_dir, ignore_errors=True)
