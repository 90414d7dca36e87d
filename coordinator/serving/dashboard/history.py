"""The run's history for the dashboard, folded incrementally from the ledger's append-only event log.

Submit events say which policy version and engine a submission used and how many completion tokens
it carried (the generation tokens/s series, for the whole run); verdict events say whether
it was accepted, why not, and the rewards the validator recomputed; publish events say when each
version appeared; train_step events go to :class:`~coordinator.serving.dashboard.training.TrainingHistory`.
:class:`RunHistory` keeps a cursor into the log and folds each new event once, so serving the
dashboard every two seconds costs a read of the few events since the last one, never a scan of
the whole run. It is pure logic (no database, no clock): the caller feeds it events and asks it
for series. Event payloads were written by the ledger itself, but are still
read defensively: a field of an unexpected type counts as absent.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from coordinator.serving.dashboard.training import TrainingHistory
from protocol.schemas import DashboardVerdict, EngineName, Event, SeriesPoint

MAX_REWARD_POINTS = 500
MAX_RECENT_VERDICTS = 50
MAX_ACCEPTED_RECORDS = 20_000
NUM_RATE_BUCKETS = 60
MIN_RATE_BUCKET_S = 5.0


@dataclass
class VersionTally:
    """What the event log says about one policy version."""

    published_at: float | None = None
    total_size_bytes: int | None = None
    kind: Literal["full", "patch"] | None = None
    base_version: int | None = None
    checkpoint_bytes: int | None = None
    num_accepted: int = 0
    num_rejected: int = 0
    reward_sum: float = 0.0
    num_rewards: int = 0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.num_rewards if self.num_rewards else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _engine(value: object) -> EngineName | None:
    if value == "vllm":
        return "vllm"
    if value == "hf":
        return "hf"
    return None


def _rewards(value: object) -> list[float]:
    if not isinstance(value, list):
        return []
    rewards = [float(r) for r in value if isinstance(r, int | float) and not isinstance(r, bool)]
    return [r for r in rewards if math.isfinite(r)]


class RunHistory:
    """Folds events (in log order) into per-version tallies, recent verdicts and chart series."""

    def __init__(self) -> None:
        self.after = 0
        """The id of the last event folded: read the log from after it."""
        self.started_at: float | None = None
        """When the first event of the run was logged: the throughput series starts there."""
        self.versions: dict[int, VersionTally] = {}
        self.recent: deque[DashboardVerdict] = deque(maxlen=MAX_RECENT_VERDICTS)
        self.rewards: deque[DashboardVerdict] = deque(maxlen=MAX_REWARD_POINTS)
        self._accepted: deque[tuple[float, int]] = deque(maxlen=MAX_ACCEPTED_RECORDS)
        self._generated: deque[tuple[float, int]] = deque(maxlen=MAX_ACCEPTED_RECORDS)
        self._submitted: dict[str, tuple[int | None, EngineName | None]] = {}
        self.training = TrainingHistory()

    def fold(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.event_id <= self.after:
                continue  # already folded (pages may overlap when the caller retries)
            self.after = event.event_id
            if self.started_at is None:
                self.started_at = event.at
            if event.kind == "publish":
                self._publish(event)
            elif event.kind == "submit" and event.subject is not None:
                self._submitted[event.subject] = (
                    _int(event.data.get("policy_version")),
                    _engine(event.data.get("engine")),
                )
                tokens = _int(event.data.get("completion_tokens"))
                if tokens is not None:  # absent from the submit events of older ledgers
                    self._generated.append((event.at, tokens))
            elif event.kind == "verdict" and event.subject is not None:
                self._verdict(event, event.subject)
            elif event.kind == "train_step":
                self.training.fold(event)

    def _publish(self, event: Event) -> None:
        version = _int(int(event.subject)) if event.subject and event.subject.isdigit() else None
        if version is None:
            return
        tally = self.versions.setdefault(version, VersionTally())
        tally.published_at = event.at
        tally.total_size_bytes = _int(event.data.get("total_size_bytes"))
        kind = event.data.get("published_as")
        tally.kind = "patch" if kind == "patch" else "full" if kind == "full" else None
        tally.base_version = _int(event.data.get("base_version")) if tally.kind == "patch" else None
        tally.checkpoint_bytes = _int(event.data.get("checkpoint_bytes"))

    def _verdict(self, event: Event, submission_id: str) -> None:
        policy_version, engine = self._submitted.pop(submission_id, (None, None))
        accepted = event.data.get("accepted") is True
        reasons = event.data.get("reasons")
        rewards = _rewards(event.data.get("rewards"))
        worker_id = event.data.get("worker_id")
        verdict = DashboardVerdict(
            event_id=event.event_id,
            at=event.at,
            submission_id=submission_id,
            worker_id=worker_id if isinstance(worker_id, str) else "",
            validator_id=event.node_id,
            policy_version=policy_version,
            engine=engine,
            accepted=accepted,
            reasons=[str(reason) for reason in reasons] if isinstance(reasons, list) else [],
            num_rollouts=len(rewards),
            mean_reward=sum(rewards) / len(rewards) if rewards else None,
        )
        self.recent.append(verdict)
        if rewards:
            self.rewards.append(verdict)
        if accepted:
            self._accepted.append((event.at, len(rewards)))
        if policy_version is not None:
            tally = self.versions.setdefault(policy_version, VersionTally())
            if accepted:
                tally.num_accepted += 1
                tally.reward_sum += sum(rewards)
                tally.num_rewards += len(rewards)
            else:
                tally.num_rejected += 1

    def accepted_samples_per_s(self, now: float) -> list[SeriesPoint]:
        """Accepted rollouts per second since the run's first event (or the oldest record kept), up to ``now``."""
        if self.started_at is None:
            return []
        start = self.started_at
        if len(self._accepted) == self._accepted.maxlen:  # older records were dropped: start where those kept do
            start = max(start, self._accepted[0][0])
        return rate_series(list(self._accepted), start, now)

    def generated_tokens_per_s(self, now: float) -> list[SeriesPoint]:
        """Completion tokens submitted per second since the run's first event (or the oldest record kept)."""
        if self.started_at is None:
            return []
        start = self.started_at
        if len(self._generated) == self._generated.maxlen:
            start = max(start, self._generated[0][0])
        return rate_series(list(self._generated), start, now)


def rate_series(
    records: Sequence[tuple[float, int]],
    start: float,
    now: float,
    num_buckets: int = NUM_RATE_BUCKETS,
    min_bucket_s: float = MIN_RATE_BUCKET_S,
) -> list[SeriesPoint]:
    """Counts per second in equal time buckets from ``start`` to ``now``; each point sits at its bucket's end.

    The bucket width grows with the span (never under ``min_bucket_s``) so a long run still
    draws as at most ``num_buckets`` points. Records outside the span are ignored.
    """
    if now <= start:
        return []
    bucket_s = max(min_bucket_s, (now - start) / num_buckets)
    used = max(1, min(num_buckets, math.ceil((now - start) / bucket_s)))
    counts = [0] * used
    first = now - used * bucket_s
    for at, count in records:
        if first <= at <= now:
            counts[min(used - 1, int((at - first) // bucket_s))] += count
    return [SeriesPoint(at=first + (i + 1) * bucket_s, value=count / bucket_s) for i, count in enumerate(counts)]
