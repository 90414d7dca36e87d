"""Prometheus metrics of the ledger (`GET /metrics`), in a registry owned by one app instance.

Request counts and latencies are recorded by the API middleware (:mod:`runtime.http_metrics`);
run-level gauges (policy version, live nodes, open tasks, submissions by status, how the newest
step's rollouts ended and what the trainer measured on it, the newest eval of a policy) are read from
the ledger when Prometheus scrapes, so they are right after a restart and across replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import Scope

from protocol.schemas import RunStatus
from runtime.http_metrics import route_template

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _RunCollector(Collector):
    def __init__(self, read_status: Callable[[], RunStatus]) -> None:
        self.read_status = read_status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = self.read_status()
        gauges = {
            "prime_ledger_policy_version": ("Current policy version.", status.current_policy_version),
            "prime_ledger_workers_live": ("Workers heard from recently.", status.num_workers_live),
            "prime_ledger_validators_live": ("Validators heard from recently.", status.num_validators_live),
            "prime_ledger_tasks_open": ("Tasks open or leased, not yet submitted.", status.num_tasks_open),
            "prime_train_steps_done": ("Training steps trained and published.", status.num_train_steps_done),
            "prime_train_breaker_trips": (
                "Updates the pre-step breakers refused in the run.",
                status.num_breaker_trips,
            ),
            "prime_train_rollbacks": ("Rollbacks to an earlier version in the run.", status.num_rollbacks),
        }
        for name, (documentation, value) in gauges.items():
            yield GaugeMetricFamily(name, documentation, value=value)
        submissions = GaugeMetricFamily("prime_ledger_submissions", "Submissions by status.", labels=["status"])
        submissions.add_metric(["pending"], status.num_submissions_pending)
        submissions.add_metric(["accepted"], status.num_submissions_accepted)
        submissions.add_metric(["rejected"], status.num_submissions_rejected)
        submissions.add_metric(["environment_error"], status.num_submissions_environment_error)
        submissions.add_metric(["expired"], status.num_submissions_expired)
        yield submissions
        rewards = GaugeMetricFamily(
            "prime_train_step_reward", "Each named reward's batch mean in the newest trained step.", labels=["reward"]
        )
        for reward_name, mean in status.step_rewards.items():
            rewards.add_metric([reward_name], mean)
        yield rewards
        known = {
            "prime_train_step_completion_tokens": (
                "Mean completion length (tokens) in the newest trained step's batch.",
                status.step_completion_tokens_mean,
            ),
            "prime_train_step_stop_fraction": (
                "Fraction of the newest trained step's rollouts that ended with EOS.",
                status.step_stop_fraction,
            ),
            "prime_train_step_truncated_fraction": (
                "Fraction of the newest trained step's rollouts cut at max_tokens without EOS.",
                status.step_truncated_fraction,
            ),
            "prime_train_step_loss": ("The trainer's loss in the newest trained step.", status.step_loss),
            "prime_train_step_entropy": ("Mean policy entropy in the newest trained step.", status.step_entropy),
            "prime_train_step_mismatch_kl": (
                "KL between the workers' sampling and the trainer's logprobs in the newest trained step.",
                status.step_mismatch_kl,
            ),
            "prime_train_step_grad_norm": (
                "Gradient norm before clipping in the newest trained step.",
                status.step_grad_norm,
            ),
            "prime_train_step_out_of_band_fraction": (
                "Share of the newest trained step's tokens whose importance ratio left the breakers' band.",
                status.step_out_of_band_fraction,
            ),
            "prime_train_step_zero_signal_fraction": (
                "Share of the newest trained step's groups without reward spread (credited, not trained).",
                status.step_zero_signal_fraction,
            ),
            "prime_train_eval_step": ("The newest step whose policy was evaluated.", status.eval_step),
            "prime_train_eval_accuracy": ("Exact-answer accuracy of the newest eval.", status.eval_accuracy),
            "prime_train_eval_reward": ("Mean reward of the newest eval.", status.eval_reward_mean),
            "prime_train_eval_stop_fraction": ("Stop fraction of the newest eval.", status.eval_stop_fraction),
            "prime_train_eval_completion_tokens": (
                "Mean completion length (tokens) of the newest eval.",
                status.eval_completion_tokens_mean,
            ),
        }
        for name, (documentation, figure) in known.items():
            if figure is not None:  # absent until known, rather than a misleading 0
                yield GaugeMetricFamily(name, documentation, value=figure)


class LedgerMetrics:
    def __init__(self, read_status: Callable[[], RunStatus]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "prime_ledger_requests", "HTTP requests served.", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "prime_ledger_request_seconds",
            "Time to serve a request.",
            ["route"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_RunCollector(read_status))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method=method, route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def observe_request(self, scope: Scope, status: int | None, seconds: float) -> None:
        """One request, by its route template (:class:`runtime.http_metrics.RequestMetrics` calls it); one the
        app answered nothing counts as the 500 the server sends in its place."""
        self.observe(scope["method"], route_template(scope), 500 if status is None else status, seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
