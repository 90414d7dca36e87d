"""The coordinator's work beside its API: the local network, the trainer service and the RL loop.

:class:`RunThread` runs in a thread of `prime-coordinator start` once uvicorn serves: it starts
the `[local_network]` children (if enabled), the trainer service and the
:class:`~coordinator.loop.orchestrator.Orchestrator` (if `[orchestrator]` is enabled) with the
run's metrics file (:mod:`coordinator.loop.run_metrics`) and its evals during training
(:mod:`coordinator.loop.evals`), prints a progress line every few seconds and, when the last step
is published and the last evals are in, the reward curve and where the run's files are. Then it
stops every child it started and asks the server to exit (``orchestrator.exit_when_done``). The
children are started from this thread and it stops them before it ends, so their parent-death
signal fires only when the coordinator dies.
A failure (a child exited) ends the run too; :meth:`RunThread.finish` re-raises it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.train_steps import StepRecord
from coordinator.loop.canary import Canary
from coordinator.loop.evals import PolicyEvals
from coordinator.loop.orchestrator import Orchestrator, StoppedError
from coordinator.loop.run_metrics import METRICS_FILE, RunMetricsFile
from coordinator.loop.tracking import Trackers, open_trackers
from coordinator.processes.local_network import Processes, start_local_network
from coordinator.processes.trainer_process import TrainerProcess
from protocol.identity import NodeIdentity
from runtime.config import config_to_toml
from shardcast.format.store import VersionStore
from trainer.config import EvalConfig
from trainer.transport import TrainDir

log = logging.getLogger("coordinator.loop.runner")
TRACKED_CONFIG = {"run_name", "environment", "scheduling", "policy", "orchestrator"}
"""The config sections a W&B run is given (what was trained, how), never the API's or the ledger's."""


def _figure(metrics: dict[str, Any], key: str, spec: str) -> str:
    value = metrics.get(key)
    return format(value, spec) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def rollout_fields(last: dict[str, Any], newest_eval: tuple[int, dict[str, Any]] | None) -> str:
    """How the newest step's rollouts ended (mean length, stop and truncated fractions) and the newest eval."""
    fields = (
        f"len {_figure(last, 'batch_completion_tokens_mean', '.1f')}"
        f"  stop {_figure(last, 'batch_stop_fraction', '.2f')}"
        f"  trunc {_figure(last, 'batch_truncated_fraction', '.2f')}"
    )
    if newest_eval is not None:
        step, metrics = newest_eval
        fields += (
            f"  eval v{step} acc {_figure(metrics, 'eval_accuracy', '.3f')}"
            f" reward {_figure(metrics, 'eval_reward_mean', '.3f')}"
        )
    return fields


def progress_line(
    config: CoordinatorConfig, ledger: Ledger, elapsed_s: float, newest_eval: tuple[int, dict[str, Any]] | None = None
) -> str:
    """Step, live workers and validators, last batch reward, accepted/rejected, generation tokens/s, batch
    staleness, how the last batch's rollouts ended, the newest eval (when known) and the updates refused and
    rollbacks (when any), on one line."""
    status = ledger.status()
    tokens_per_s = ledger.live_tokens_per_s()
    num_trained, last = ledger.train_steps.trained_progress()
    reward = f"{last['batch_reward_mean']:.3f}" if "batch_reward_mean" in last else "-"
    staleness = f"{last['batch_staleness_mean']:.2f}" if "batch_staleness_mean" in last else "-"
    safety = f"  refused {status.num_breaker_trips}" if status.num_breaker_trips else ""
    safety += f"  rollbacks {status.num_rollbacks}" if status.num_rollbacks else ""
    return (
        f"{elapsed_s:6.0f}s  step {num_trained}/{config.orchestrator.num_steps}"
        f"  policy v{status.current_policy_version}"
        f"  workers {status.num_workers_live}  validators {status.num_validators_live}"
        f"  reward {reward}  accepted {status.num_submissions_accepted}  rejected {status.num_submissions_rejected}"
        f"  pending {status.num_submissions_pending}  tokens/s {tokens_per_s:.0f}  staleness {staleness}"
        f"  {rollout_fields(last, newest_eval)}{safety}"
    )


def write_final_eval_config(config: CoordinatorConfig) -> Path:
    """An eval config of the final policy on this run's environment, sampling and budget, beside the policy."""
    evaluation = EvalConfig(
        model=str(config.final_policy_dir.resolve()),
        environment=config.environment,
        max_tokens=config.scheduling.max_tokens,
        temperature=config.scheduling.temperature,
    )
    path = config.data_dir / "final-eval.toml"
    path.write_text(config_to_toml(evaluation))
    return path.resolve()


def reward_curve(steps: list[StepRecord]) -> str:
    lines = ["step  reward  staleness  samples  loss    length  stop  eval acc"]
    for record in steps:
        m = record.metrics
        if not m:
            continue
        lines.append(
            f"{record.step:4d}  {m.get('batch_reward_mean', float('nan')):6.3f}  "
            f"{m.get('batch_staleness_mean', float('nan')):9.2f}  {int(m.get('batch_num_samples', 0)):7d}  "
            f"{m.get('loss', float('nan')):.4f}  {_figure(m, 'batch_completion_tokens_mean', '6.1f'):>6}  "
            f"{_figure(m, 'batch_stop_fraction', '.2f'):>4}  {_figure(m, 'eval_accuracy', '.3f'):>8}"
        )
    return "\n".join(lines)


class RunThread(threading.Thread):
    def __init__(
        self,
        config: CoordinatorConfig,
        ledger: Ledger,
        identity: NodeIdentity,
        store: VersionStore,
        server: Any,
        url: str,
    ) -> None:
        super().__init__(name="coordinator-run", daemon=True)
        self.config = config
        self.ledger = ledger
        self.identity = identity
        self.store = store
        self.server = server
        self.url = url
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.network: Processes | None = None
        self.trainer: TrainerProcess | None = None
        self.evals: PolicyEvals | None = None
        self.canary: Canary | None = None
        self.metrics_file = RunMetricsFile(config.data_dir / METRICS_FILE)
        self.trackers: Trackers | None = None
        self.newest_eval: tuple[int, dict[str, Any]] | None = ledger.newest_eval()
        self.started_at = time.monotonic()
        self._next_progress = 0.0

    def run(self) -> None:
        try:
            while not self.server.started and not self.stop_event.wait(0.05):
                pass
            if self.stop_event.is_set():
                return
            self._run()
        except StoppedError:
            pass
        except BaseException as exc:  # reported by finish() in the main thread
            log.error("the run stopped: %s", exc)
            self.error = exc
        finally:
            self._stop_children()
            if self.trackers is not None:
                self.trackers.close()
            self.server.should_exit = True

    def _open_trackers(self) -> None:
        """TensorBoard and W&B, when ``[orchestrator.tracking]`` switches them on: every new metrics row goes there."""
        config = self.config
        shared = config.model_dump(mode="json", include=TRACKED_CONFIG)  # never the ledger URL or the API's keys
        self.trackers = open_trackers(config.orchestrator.tracking, config.run_name, config.data_dir, shared)
        self.metrics_file.sink = self.trackers

    def _run(self) -> None:
        config = self.config
        if config.orchestrator.enabled:
            self._open_trackers()
        steps = self.ledger.train_steps
        training = config.orchestrator.enabled and steps.num_published() < config.orchestrator.num_steps
        if config.local_network.enabled and (training or not config.orchestrator.enabled):
            root = config.data_dir / "network"
            print(f"starting the local network (relay, workers {config.local_network.engines}, validator) in {root}")
            self.network = start_local_network(
                config.local_network, self.url, self.identity.node_id, root, config.child_logs.limits()
            )
        if not config.orchestrator.enabled:
            self._idle()
            return
        if training:
            records = self._train()
            self._let_nodes_hear_the_end()
        else:
            records = steps.steps()
            self.metrics_file.sync(records, self.ledger.clock())  # a run trained before the file existed
            print("this run has already trained all its steps (`prime-coordinator reset -c CONFIG` starts it over)")
        print(f"\nreward per step (validator-recomputed reward of each step's batch):\n{reward_curve(records)}")
        where = config.data_dir.resolve()
        print(f"run files: ledger, policies, trainer checkpoints and logs are in {where}", flush=True)
        print(f"metrics of every step and eval (JSON lines): {self.metrics_file.path.resolve()}", flush=True)
        if config.final_policy_dir.is_dir():
            eval_config = write_final_eval_config(config)
            final = config.final_policy_dir.resolve()
            print(
                f"final policy (v{config.orchestrator.num_steps}), an HF checkpoint: {final}"
                f"\nevaluate it on the environment's held-out examples: prime-trainer eval -c {eval_config}",
                flush=True,
            )
        if config.orchestrator.trainer.lora.enabled and config.final_adapter_dir.is_dir():
            adapter = config.final_adapter_dir.resolve()
            print(f"final LoRA adapter (PEFT's layout, on the start checkpoint): {adapter}", flush=True)
        if not config.orchestrator.exit_when_done:
            self._idle()

    def _train(self) -> list[StepRecord]:
        config = self.config
        train_dir = TrainDir(config.data_dir / "train")
        self.trainer = TrainerProcess.for_run(config, train_dir)
        self.trainer.start()
        log.info(
            "trainer service started (%d ranks on this machine, %d node(s), log %s)",
            self.trainer.nproc,
            self.trainer.node.nnodes,
            train_dir.log_path,
        )
        if config.orchestrator.eval_every_steps > 0:
            self.evals = PolicyEvals(config, self._record_eval, config.child_logs.limits())
            self.canary = Canary(config, self.ledger.train_steps)
        orchestrator = Orchestrator(
            config,
            self.ledger,
            self.identity,
            self.store,
            train_dir,
            self.trainer,
            self.stop_event,
            self._tick,
            metrics_file=self.metrics_file,
            evals=self.evals,
        )
        orchestrator.run()
        self._finish_evals()
        orchestrator.unfinished_rollback()
        return self.ledger.train_steps.steps()

    def _record_eval(self, step: int, figures: dict[str, float], model_dir: Path) -> None:
        """An eval's figures into the ledger (with its step), the metrics file and the console; the canary asks for
        a rollback when it fell (:mod:`coordinator.loop.canary`)."""
        self.ledger.train_steps.record_eval(step, figures)
        self.metrics_file.append("eval", step, self.ledger.clock(), figures)
        self.newest_eval = (step, figures)
        log.info(
            "eval of policy v%d: accuracy %.3f, reward %.3f, stop fraction %.2f, %.1f tokens",
            step,
            figures["eval_accuracy"],
            figures["eval_reward_mean"],
            figures["eval_stop_fraction"],
            figures["eval_completion_tokens_mean"],
        )
        request = self.canary.on_eval(step, figures, model_dir) if self.canary is not None else None
        if request is not None:
            self.ledger.train_steps.request_rollback(request)
            print(f"rolling back to v{request.to_version}: {request.reason}", flush=True)

    def _finish_evals(self) -> None:
        """Wait for the evals still queued or running (the last policy's among them): the loop is done."""
        if self.evals is None or self.evals.idle:
            return
        print("waiting for the last evals to finish", flush=True)
        while not self.evals.idle:
            self._tick()
            if self.stop_event.wait(self.config.orchestrator.poll_interval_s):
                raise StoppedError

    def _let_nodes_hear_the_end(self) -> None:
        """Keep serving a while after the last step: live workers and validators are told the run ended on their
        next lease or pending call (a long-poll at most away), finish what they hold and exit 0 by themselves."""
        deadline = time.monotonic() + self.config.orchestrator.end_grace_s
        print("the last step is published; telling the live workers and validators that the run has ended", flush=True)
        unheard = self.ledger.live_node_ids() - self.ledger.told_run_end
        while unheard and time.monotonic() < deadline and not self.stop_event.wait(0.5):
            unheard = self.ledger.live_node_ids() - self.ledger.told_run_end
        if unheard:
            log.info("%d live node(s) did not ask again before the end grace passed", len(unheard))
        # A node that heard exits by itself once it has taken the answer in: stopping it now could cut it short.
        while self.network is not None and self.network.nodes_running() and time.monotonic() < deadline:
            if self.stop_event.wait(0.2):
                break
        for name, code in (self.network.node_exit_codes() if self.network is not None else {}).items():
            if code is None:
                log.info("local %s is still running after the end grace: stopping it", name)
            else:
                log.info("local %s exited by itself with code %d", name, code)

    def _idle(self) -> None:
        while not self.stop_event.wait(self.config.orchestrator.poll_interval_s):
            self._tick()

    def _tick(self) -> None:
        if self.network is not None and not self.ledger.run_over():  # once over, its nodes stop by themselves
            self.network.check()
        if self.evals is not None:
            self.evals.poll()
        now = time.monotonic()
        if now >= self._next_progress:
            self._next_progress = now + self.config.orchestrator.progress_interval_s
            print(progress_line(self.config, self.ledger, now - self.started_at, self.newest_eval), flush=True)

    def _stop_children(self) -> None:
        if self.evals is not None:
            self.evals.stop()
        if self.network is not None:
            self.network.stop_all()
        if self.trainer is not None:
            self.trainer.stop()

    def finish(self) -> None:
        """Stop the work (the server has exited), wait for the thread, and re-raise its failure."""
        self.stop_event.set()
        self.join()
        if self.error is not None:
            raise self.error
