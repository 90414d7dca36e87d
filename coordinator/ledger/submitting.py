"""Submissions: a worker's signed rollouts for its lease, stored for the validators or refused with a reason.

A submission locks its lease's row; it is checked against the lease (its node, task and policy
version), the run's staleness bound and the claims the ledger can check without a model
(:func:`coordinator.ledger.scheduling.rollout_problems`), then stored with the share of its samples the
validators will recompute (:meth:`coordinator.ledger.validation.Validation.submission_audit_share`). A
refusal only a cheat earns (:class:`coordinator.ledger.validation.Violation`) counts against the node.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from sqlalchemy import Row, bindparam, insert, select, update

from coordinator.ledger.core import LedgerCore
from coordinator.ledger.leasing import locked_lease
from coordinator.ledger.replay import NonceClaim
from coordinator.ledger.scheduling import rollout_problems, staleness_problem
from coordinator.ledger.storage.tables import leases, submissions, tasks
from coordinator.ledger.validation import Validation, Violation
from protocol.errors import ConflictError, ForbiddenError, ProtocolError, StalePolicyError
from protocol.schemas import SubmitRequest, SubmitResponse
from protocol.signing import canonical_json, verify_canonical_document

# The statements of every submission, built once (see coordinator.ledger.storage.engine).
_SUBMISSION_OF_LEASE = select(submissions).where(submissions.c.lease_id == bindparam("b_lease_id"))
_TASK_ROW_LOCKED = select(tasks).where(tasks.c.task_id == bindparam("b_task_id")).with_for_update()
_INSERT_SUBMISSION = insert(submissions)
_MARK_LEASE_SUBMITTED = update(leases).where(leases.c.lease_id == bindparam("b_lease_id")).values(state="submitted")
_MARK_TASK_SUBMITTED = update(tasks).where(tasks.c.task_id == bindparam("b_task_id")).values(state="submitted")


class Submissions:
    """Stores or refuses submissions over the ledger's :class:`~coordinator.ledger.core.LedgerCore`."""

    def __init__(self, core: LedgerCore, validation: Validation, max_turns: int) -> None:
        self.core = core
        self.config = core.config
        self.scheduling = core.scheduling
        self.clock = core.clock
        self.validation = validation
        self.max_turns = max_turns

    def submit(
        self, node_id: str, request: SubmitRequest, worker_signature: str, nonce: NonceClaim | None = None
    ) -> SubmitResponse:
        """Store a submission for validation, or refuse it; refusals only a cheat earns count against the node."""
        try:
            return self._submit(node_id, request, worker_signature, nonce)
        except Violation as violation:
            self.validation.record_violation(node_id, violation.refusal.message, nonce)
            raise violation.refusal from None

    def _submit(
        self, node_id: str, request: SubmitRequest, worker_signature: str, nonce: NonceClaim | None
    ) -> SubmitResponse:
        body = canonical_json(request.model_dump(mode="json"))
        verify_canonical_document(node_id, body, worker_signature)
        body_sha256 = hashlib.sha256(body).hexdigest()
        now = self.clock()
        with self.core.write(nonce) as conn:
            worker = self.core.node(conn, node_id, "worker")
            lease = locked_lease(conn, request.lease_id)
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
            run = self.core.run_row(conn)
            stale = staleness_problem(
                request.policy_version, run.current_policy_version, self.scheduling.async_level, run.version_floor
            )
            if stale:
                raise StalePolicyError(stale)
            prompt_indices = [prompt["prompt_index"] for prompt in json.loads(task.prompts_json)]
            problems = rollout_problems(
                request.rollouts,
                prompt_indices,
                lease.group_size,
                json.loads(lease.sampling_json)["max_tokens"],
                self.config.policy.vocab_size,
                self.max_turns,
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
                    "audit_share": self.validation.submission_audit_share(conn, worker, request.engine),
                },
            )
            conn.execute(_MARK_LEASE_SUBMITTED, {"b_lease_id": request.lease_id})
            conn.execute(_MARK_TASK_SUBMITTED, {"b_task_id": lease.task_id})
            self.core.event(
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
