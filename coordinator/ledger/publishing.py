"""Policy versions and the run's end: the coordinator's signed manifests made current; the refusal after the end.

Publishing locks the run row, so versions only move forward; leases of versions the async level no
longer allows expire, and pending submissions whose version the origin no longer keeps are closed
(:mod:`coordinator.ledger.voiding`), in the same transaction.
"""

from __future__ import annotations

import time

from sqlalchemy import insert, select, update

from coordinator.ledger.core import RUN_ROW_ID, LedgerCore
from coordinator.ledger.leasing import end_lease
from coordinator.ledger.replay import NonceClaim
from coordinator.ledger.storage.tables import leases, policy_versions, run_state
from coordinator.ledger.train_steps import PUBLISHED_STEPS
from coordinator.ledger.validation import Validation
from protocol.errors import ConflictError, ForbiddenError, ProtocolError, RunEndedError
from protocol.schemas import MAX_POLICY_VERSION, PublishResponse, SignedManifest
from protocol.signing import verify_document


class Publishing:
    """Publishes policy versions and tells when the run is over, over the ledger's core."""

    _run_over = False
    _next_end_check = 0.0
    told_run_end: frozenset[str] = frozenset()
    """Nodes answered that the run has ended (the coordinator waits a while for the live ones to hear it)."""

    def __init__(self, core: LedgerCore, validation: Validation) -> None:
        self.core = core
        self.config = core.config
        self.scheduling = core.scheduling
        self.clock = core.clock
        self.validation = validation

    def run_over(self) -> bool:
        """Whether the RL loop has published its last step (checked at most once a second, latched once true)."""
        orchestrator = self.config.orchestrator
        if self._run_over or not orchestrator.enabled:
            return self._run_over
        now = time.monotonic()
        if now >= self._next_end_check:
            self._next_end_check = now + 1.0
            with self.core.read() as conn:
                done = conn.execute(PUBLISHED_STEPS).scalar_one()
            self._run_over = done >= orchestrator.num_steps
        return self._run_over

    def refuse_after_end(self, node_id: str) -> RunEndedError:
        """The refusal a node gets once the run is over; remembered, so the coordinator knows who heard it."""
        self.told_run_end = self.told_run_end | {node_id}
        return RunEndedError(
            f"the run {self.config.run_name!r} has ended: its {self.config.orchestrator.num_steps} steps are trained; "
            "thank you, nothing is left to do"
        )

    def publish(self, signed: SignedManifest, nonce: NonceClaim | None = None) -> PublishResponse:
        if signed.signer != self.core.coordinator_id:
            raise ForbiddenError(f"manifests must be signed by the coordinator {self.core.coordinator_id}")
        verify_document(signed.signer, signed.manifest.model_dump(mode="json"), signed.signature_b64)
        version = signed.manifest.version
        if version > MAX_POLICY_VERSION:
            raise ProtocolError(f"policy version {version} is over the limit {MAX_POLICY_VERSION}")
        now = self.clock()
        with self.core.write(nonce) as conn:
            run = self.core.run_row(conn, lock=True)
            first = version == 0 and conn.execute(select(policy_versions.c.version).limit(1)).first() is None
            if version <= run.current_policy_version and not first:
                raise ConflictError(
                    f"policy version {version} is not newer than the current {run.current_policy_version}"
                )
            conn.execute(
                insert(policy_versions).values(
                    version=version,
                    manifest_json=signed.manifest.model_dump_json(),
                    signer=signed.signer,
                    signature=signed.signature_b64,
                    published_at=now,
                )
            )
            conn.execute(update(run_state).where(run_state.c.id == RUN_ROW_ID).values(current_policy_version=version))
            oldest = max(version - self.scheduling.async_level, run.version_floor)
            for lease_id, task_id, node_id in conn.execute(
                select(leases.c.lease_id, leases.c.task_id, leases.c.node_id).where(
                    leases.c.state == "active", leases.c.policy_version < oldest
                )
            ).all():
                if end_lease(conn, lease_id, task_id, "expired", "policy"):
                    reason = f"policy moved to {version}"
                    self.core.event(conn, "expire", node_id, lease_id, task_id=task_id, reason=reason)
            # The origin prunes after this: what it drops can no longer be audited.
            self.validation.expire_unauditable(conn)
            manifest = signed.manifest
            self.core.event(
                conn,
                "publish",
                self.core.coordinator_id,
                str(version),
                total_size_bytes=manifest.total_size_bytes,
                published_as=manifest.kind,
                base_version=manifest.base_version,
                checkpoint_bytes=manifest.result_size_bytes,
            )
        return PublishResponse(version=version, published_at=now)
