"""The task ledger: every state change of a run, each one database transaction.

This is where the rules of :mod:`coordinator.ledger.scheduling`, :mod:`coordinator.ledger.reputation` and
:mod:`coordinator.ledger.seeds` meet the database. :class:`Ledger` adds what follows a lease to
:class:`coordinator.ledger.leasing.LeasingLedger` (nodes and leases) and
:class:`coordinator.ledger.validation.ValidationLedger` (the validators' pending lists, votes and
decisions, with reputation and bans): submissions and publishing policy versions. A
submission or verdict locks its lease or submission row; publishing locks the run-state row.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any

from sqlalchemy import Row, bindparam, insert, select, update

from coordinator.ledger.replay import NonceClaim
from coordinator.ledger.scheduling import rollout_problems, staleness_problem
from coordinator.ledger.storage.tables import (
    leases,
    policy_versions,
    run_state,
    submissions,
    tasks,
)
from coordinator.ledger.validation import ValidationLedger, Violation
from coordinator.ledger.views import PUBLISHED_STEPS, RUN_ROW_ID
from protocol.errors import (
    ConflictError,
    ForbiddenError,
    ProtocolError,
    RunEndedError,
    StalePolicyError,
)
from protocol.schemas import (
    MAX_POLICY_VERSION,
    PublishResponse,
    SignedManifest,
    SubmitRequest,
    SubmitResponse,
)
from protocol.signing import canonical_json, verify_canonical_document, verify_document

# The statements of every submission, built once (see coordinator.ledger.storage.engine).
_SUBMISSION_OF_LEASE = select(submissions).where(submissions.c.lease_id == bindparam("b_lease_id"))
_TASK_ROW_LOCKED = select(tasks).where(tasks.c.task_id == bindparam("b_task_id")).with_for_update()
_INSERT_SUBMISSION = insert(submissions)
_MARK_LEASE_SUBMITTED = update(leases).where(leases.c.lease_id == bindparam("b_lease_id")).values(state="submitted")
_MARK_TASK_SUBMITTED = update(tasks).where(tasks.c.task_id == bindparam("b_task_id")).values(state="submitted")


class Ledger(ValidationLedger):
    """The run's single source of truth, over one :class:`~coordinator.ledger.storage.engine.Database`."""

    _run_over = False
    _next_end_check = 0.0
    told_run_end: frozenset[str] = frozenset()
    """Nodes answered that the run has ended (the coordinator waits a while for the live ones to hear it)."""

    def run_over(self) -> bool:
        """Whether the RL loop has published its last step (checked at most once a second, latched once true)."""
        orchestrator = self.config.orchestrator
        if self._run_over or not orchestrator.enabled:
            return self._run_over
        now = time.monotonic()
        if now >= self._next_end_check:
            self._next_end_check = now + 1.0
            with self.db.read() as conn:
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

    @property
    def vocab_size(self) -> int | None:
        """The policy's vocabulary size (policy.vocab_size): larger token ids are refused at the door."""
        return self.config.policy.vocab_size

    # ---- submissions ---------------------------------------------------------------------------

    def submit(
        self, node_id: str, request: SubmitRequest, worker_signature: str, nonce: NonceClaim | None = None
    ) -> SubmitResponse:
        """Store a submission for validation, or refuse it; refusals only a cheat earns count against the node."""
        try:
            return self._submit(node_id, request, worker_signature, nonce)
        except Violation as violation:
            self.record_violation(node_id, violation.refusal.message, nonce)
            raise violation.refusal from None

    def _submit(
        self, node_id: str, request: SubmitRequest, worker_signature: str, nonce: NonceClaim | None
    ) -> SubmitResponse:
        body = canonical_json(request.model_dump(mode="json"))
        verify_canonical_document(node_id, body, worker_signature)
        body_sha256 = hashlib.sha256(body).hexdigest()
        now = self.clock()
        with self._write(nonce) as conn:
            worker = self._node(conn, node_id, "worker")
            lease = self._lease_row(conn, request.lease_id)
            if lease.node_id != node_id:  # a Violation here, unlike _own_lease: only a cheat submits another's
                raise Violation(ForbiddenError(f"lease {request.lease_id} belongs to another node"))
            earlier = conn.execute(_SUBMISSION_OF_LEASE, {"b_lease_id": request.lease_id}).first()
            if earlier is not None:
                if earlier.body_sha256 != body_sha256:
                    raise Violation(
                        ConflictError(
                            f"lease {request.lease_id} was already submitted ({earlier.submission_id}) "
                            "with other content"
                        )
                    )
                return SubmitResponse(submission_id=earlier.submission_id, status=earlier.status, duplicate=True)
            if request.task_id != lease.task_id:
                raise Violation(
                    ConflictError(f"lease {request.lease_id} is for task {lease.task_id}, not {request.task_id}")
                )
            task = conn.execute(_TASK_ROW_LOCKED, {"b_task_id": lease.task_id}).one()
            self._check_lease_open(lease, task)
            if request.policy_version != lease.policy_version:
                raise Violation(
                    ConflictError(
                        f"lease {request.lease_id} is for policy version {lease.policy_version}, "
                        f"not {request.policy_version}"
                    )
                )
            run = self._run(conn)
            stale = staleness_problem(request.policy_version, run.current_policy_version, self.scheduling.async_level)
            if stale:
                raise StalePolicyError(stale)
            prompt_indices = [prompt["prompt_index"] for prompt in json.loads(task.prompts_json)]
            problems = rollout_problems(
                request.rollouts,
                prompt_indices,
                lease.group_size,
                json.loads(lease.sampling_json)["max_tokens"],
                self.vocab_size,
                self.prompts.max_turns,
            )
            if problems:
                raise Violation(ProtocolError("; ".join(problems[:5])))
            submission_id = f"s-{secrets.token_hex(12)}"
            conn.execute(
                _INSERT_SUBMISSION,
                {
                    "submission_id": submission_id,
                    "lease_id": request.lease_id,
                    "task_id": lease.task_id,
                    "node_id": node_id,
                    "policy_version": request.policy_version,
                    "body_sha256": body_sha256,
                    "body_json": body.decode(),
                    "worker_signature": worker_signature,
                    "submitted_at": now,
                    "status": "pending",
                    "audit_share": self.submission_audit_share(conn, worker, request.engine),
                },
            )
            conn.execute(_MARK_LEASE_SUBMITTED, {"b_lease_id": request.lease_id})
            conn.execute(_MARK_TASK_SUBMITTED, {"b_task_id": lease.task_id})
            self._event(
                conn,
                "submit",
                node_id,
                submission_id,
                lease_id=request.lease_id,
                task_id=lease.task_id,
                policy_version=request.policy_version,
                engine=request.engine,
                completion_tokens=sum(len(rollout.completion_ids) for rollout in request.rollouts),
            )
        return SubmitResponse(submission_id=submission_id, status="pending", duplicate=False)

    @staticmethod
    def _check_lease_open(lease: Row[Any], task: Row[Any]) -> None:
        """A lease may be submitted while active (even just past its deadline, until maintenance expires it),
        or after expiry as long as nobody else took the task meanwhile."""
        if lease.state == "abandoned":
            raise ConflictError(f"lease {lease.lease_id} was abandoned; lease a new task")
        if lease.state == "expired" and task.state != "open":
            cause = (
                f"the policy moved on while it was out (results of version {lease.policy_version} are stale now)"
                if lease.end_reason == "policy"
                else "its deadline passed before it was renewed (renew leases before their deadline)"
            )
            raise ConflictError(f"lease {lease.lease_id} expired because {cause}; task {task.task_id} was re-issued")

    # ---- policy versions -----------------------------------------------------------------------

    def publish(self, signed: SignedManifest, nonce: NonceClaim | None = None) -> PublishResponse:
        if signed.signer != self.coordinator_id:
            raise ForbiddenError(f"manifests must be signed by the coordinator {self.coordinator_id}")
        verify_document(signed.signer, signed.manifest.model_dump(mode="json"), signed.signature_b64)
        version = signed.manifest.version
        if version > MAX_POLICY_VERSION:
            raise ProtocolError(f"policy version {version} is over the limit {MAX_POLICY_VERSION}")
        now = self.clock()
        with self._write(nonce) as conn:
            run = self._run(conn, lock=True)
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
            oldest = version - self.scheduling.async_level
            for lease_id, task_id, node_id in conn.execute(
                select(leases.c.lease_id, leases.c.task_id, leases.c.node_id).where(
                    leases.c.state == "active", leases.c.policy_version < oldest
                )
            ).all():
                if self._end_lease(conn, lease_id, task_id, "expired", "policy"):
                    self._event(conn, "expire", node_id, lease_id, task_id=task_id, reason=f"policy moved to {version}")
            self.expire_unauditable(conn)  # the origin prunes after this: what it drops can no longer be audited
            manifest = signed.manifest
            self._event(
                conn,
                "publish",
                self.coordinator_id,
                str(version),
                total_size_bytes=manifest.total_size_bytes,
                published_as=manifest.kind,
                base_version=manifest.base_version,
                checkpoint_bytes=manifest.result_size_bytes,
            )
        return PublishResponse(version=version, published_at=now)
