"""The task ledger: every state change of a run, each one database transaction, behind one facade.

:class:`Ledger` is what the API, the RL loop and the tests hold. It builds the ledger's parts on one
:class:`~coordinator.ledger.core.LedgerCore` (the run row, write transactions, the event log) and passes
each call to the part that owns it:

- :class:`~coordinator.ledger.leasing.Leases`: nodes register and heartbeat; tasks are leased, renewed,
  abandoned and expired;
- :class:`~coordinator.ledger.submitting.Submissions`: a worker's rollouts stored or refused;
- :class:`~coordinator.ledger.validation.Validation`: the validators' pending lists, votes and decisions,
  with reputation and bans;
- :class:`~coordinator.ledger.publishing.Publishing`: policy versions and the run's end;
- :class:`~coordinator.ledger.train_steps.TrainSteps`: the orchestrator's steps and their batches;
- :class:`~coordinator.ledger.views.LedgerViews`: read-only views (status, stats, the event log).

The rules they apply are pure functions next to them (:mod:`~coordinator.ledger.scheduling`,
:mod:`~coordinator.ledger.reputation`, :mod:`~coordinator.ledger.quorum`, :mod:`~coordinator.ledger.seeds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Row

from coordinator.config import CoordinatorConfig
from coordinator.ledger.change_feed import ChangeFeed
from coordinator.ledger.core import LedgerCore
from coordinator.ledger.leasing import Leases
from coordinator.ledger.publishing import Publishing
from coordinator.ledger.replay import NonceClaim
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.submitting import Submissions
from coordinator.ledger.train_steps import TrainSteps
from coordinator.ledger.validation import Validation
from coordinator.ledger.views import LedgerViews
from environments.prompts import PromptSource
from protocol.errors import RunEndedError
from protocol.schemas import (
    AuditPolicy,
    EventPage,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    LeaseResponse,
    LeaseState,
    PendingSubmissions,
    PublishResponse,
    RegisterRequest,
    RegisterResponse,
    RunStats,
    RunStatus,
    SignedManifest,
    SubmitRequest,
    SubmitResponse,
    Verdict,
    VerdictResponse,
)


class Ledger:
    """The run's single source of truth, over one :class:`~coordinator.ledger.storage.engine.Database`."""

    def __init__(
        self,
        database: Database,
        config: CoordinatorConfig,
        prompts: PromptSource,
        coordinator_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = LedgerCore(database, config, coordinator_id, clock)
        self.views = LedgerViews(self.core)
        self.leases = Leases(self.core, prompts)
        self.validation = Validation(self.core, self.views)
        self.submissions = Submissions(self.core, self.validation, prompts.max_turns)
        self.publishing = Publishing(self.core, self.validation)
        self.train_steps = TrainSteps(self.core)
        self.db = database
        self.config = config
        self.scheduling = config.scheduling
        self.prompts = prompts
        self.coordinator_id = coordinator_id
        self.clock = clock
        self.changes = self.core.changes
        """Told the event kinds of each committed write (see :mod:`coordinator.ledger.changes`)."""
        self.sources = self.leases.sources
        """Which source (network) each node counts against (see :mod:`coordinator.ledger.sources`)."""

    # ---- the processes on one ledger -----------------------------------------------------------

    @property
    def feed(self) -> ChangeFeed | None:
        """The change feed between the processes on one PostgreSQL ledger (None until :meth:`share_changes`)."""
        return self.core.feed

    def share_changes(self) -> None:
        self.core.share_changes()

    def stop_sharing_changes(self) -> None:
        self.core.stop_sharing_changes()

    # ---- nodes and leases ----------------------------------------------------------------------

    def register(
        self, node_id: str, ip: str, request: RegisterRequest, nonce: NonceClaim | None = None
    ) -> RegisterResponse:
        return self.leases.register(node_id, ip, request, nonce)

    def heartbeat(self, node_id: str, request: HeartbeatRequest, nonce: NonceClaim | None = None) -> HeartbeatResponse:
        return self.leases.heartbeat(node_id, request, nonce)

    def lease(self, node_id: str, request: LeaseRequest, nonce: NonceClaim | None = None) -> LeaseResponse:
        return self.leases.lease(node_id, request, nonce)

    def renew(self, node_id: str, lease_id: str, nonce: NonceClaim | None = None) -> LeaseState:
        return self.leases.renew(node_id, lease_id, nonce)

    def abandon(self, node_id: str, lease_id: str, nonce: NonceClaim | None = None) -> LeaseState:
        return self.leases.abandon(node_id, lease_id, nonce)

    def expire_overdue(self) -> int:
        return self.leases.expire_overdue()

    # ---- submissions and verdicts --------------------------------------------------------------

    def submit(
        self, node_id: str, request: SubmitRequest, worker_signature: str, nonce: NonceClaim | None = None
    ) -> SubmitResponse:
        return self.submissions.submit(node_id, request, worker_signature, nonce)

    def pending(self, validator_id: str, limit: int, nonce: NonceClaim | None = None) -> PendingSubmissions:
        return self.validation.pending(validator_id, limit, nonce)

    def post_verdict(self, validator_id: str, verdict: Verdict, nonce: NonceClaim | None = None) -> VerdictResponse:
        return self.validation.post_verdict(validator_id, verdict, nonce)

    def caught_by_trainer(self, submission_ids: list[str], reason: str) -> list[str]:
        return self.validation.caught_by_trainer(submission_ids, reason)

    @property
    def audit_policy(self) -> AuditPolicy:
        return self.validation.audit_policy

    def audit_indices(self, submission_id: str, num_rollouts: int, share: float | None = None) -> list[int]:
        return self.validation.audit_indices(submission_id, num_rollouts, share)

    # ---- policy versions and the run's end -----------------------------------------------------

    def publish(self, signed: SignedManifest, nonce: NonceClaim | None = None) -> PublishResponse:
        return self.publishing.publish(signed, nonce)

    def run_over(self) -> bool:
        return self.publishing.run_over()

    def refuse_after_end(self, node_id: str) -> RunEndedError:
        return self.publishing.refuse_after_end(node_id)

    @property
    def told_run_end(self) -> frozenset[str]:
        """Nodes answered that the run has ended (the coordinator waits a while for the live ones to hear it)."""
        return self.publishing.told_run_end

    # ---- reads ---------------------------------------------------------------------------------

    def status(self) -> RunStatus:
        return self.views.status()

    def stats(self, limit: int) -> RunStats:
        return self.views.stats(limit)

    def events(self, after: int, limit: int) -> EventPage:
        return self.views.events(after, limit)

    def manifest(self, version: int | None) -> SignedManifest:
        return self.views.manifest(version)

    def newest_eval(self) -> tuple[int, dict[str, Any]] | None:
        return self.views.newest_eval()

    def live_node_ids(self) -> set[str]:
        return self.views.live_node_ids()

    def live_tokens_per_s(self) -> float:
        return self.views.live_tokens_per_s()

    def flagged(self, node: Row[Any]) -> bool:
        return self.views.flagged(node)

    def ping(self) -> None:
        self.views.ping()
