"""The task ledger: every state change of a run, each one database transaction.

This is where the rules of :mod:`coordinator.scheduling`, :mod:`coordinator.reputation` and
:mod:`coordinator.seeds` meet the database. :class:`Ledger` adds what follows a lease to
:class:`coordinator.leasing.LeasingLedger` (nodes and leases): submissions, the validators'
pending list and verdicts (with reputation and bans), and publishing policy versions. A
submission or verdict locks its lease or submission row; publishing locks the run-state row.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from coordinator.leasing import LeasingLedger
from coordinator.replay import NonceClaim
from coordinator.reputation import ban_reason
from coordinator.scheduling import rollout_problems, staleness_problem
from coordinator.storage.tables import (
    accepted_groups,
    leases,
    nodes,
    policy_versions,
    run_state,
    submissions,
    tasks,
)
from coordinator.views import RUN_ROW_ID
from protocol.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ProtocolError,
    StalePolicyError,
)
from protocol.schemas import (
    PendingSubmission,
    PendingSubmissions,
    PublishResponse,
    SignedManifest,
    SubmitRequest,
    SubmitResponse,
    Verdict,
    VerdictResponse,
)
from protocol.signing import canonical_json, verify_document

MAX_POLICY_VERSION = 2**31 - 1  # stored as a 32-bit INTEGER


class Ledger(LeasingLedger):
    """The run's single source of truth, over one :class:`~coordinator.storage.engine.Database`."""

    # ---- submissions ---------------------------------------------------------------------------

    def submit(
        self, node_id: str, request: SubmitRequest, worker_signature: str, nonce: NonceClaim | None = None
    ) -> SubmitResponse:
        document = request.model_dump(mode="json")
        verify_document(node_id, document, worker_signature)
        body_sha256 = hashlib.sha256(canonical_json(document)).hexdigest()
        now = self.clock()
        with self._write(nonce) as conn:
            self._node(conn, node_id, "worker")
            lease = self._own_lease(conn, node_id, request.lease_id)
            earlier = conn.execute(select(submissions).where(submissions.c.lease_id == request.lease_id)).first()
            if earlier is not None:
                if earlier.body_sha256 != body_sha256:
                    raise ConflictError(
                        f"lease {request.lease_id} was already submitted ({earlier.submission_id}) with other content"
                    )
                return SubmitResponse(submission_id=earlier.submission_id, status=earlier.status, duplicate=True)
            if request.task_id != lease.task_id:
                raise ConflictError(f"lease {request.lease_id} is for task {lease.task_id}, not {request.task_id}")
            task = conn.execute(select(tasks).where(tasks.c.task_id == lease.task_id).with_for_update()).one()
            self._check_lease_open(lease, task)
            if request.policy_version != lease.policy_version:
                raise ConflictError(
                    f"lease {request.lease_id} is for policy version {lease.policy_version}, "
                    f"not {request.policy_version}"
                )
            run = self._run(conn)
            stale = staleness_problem(request.policy_version, run.current_policy_version, self.scheduling.async_level)
            if stale:
                raise StalePolicyError(stale)
            prompt_indices = [prompt["prompt_index"] for prompt in json.loads(task.prompts_json)]
            problems = rollout_problems(
                request.rollouts, prompt_indices, lease.group_size, json.loads(lease.sampling_json)["max_tokens"]
            )
            if problems:
                raise ProtocolError("; ".join(problems[:5]))
            submission_id = f"s-{secrets.token_hex(12)}"
            conn.execute(
                insert(submissions).values(
                    submission_id=submission_id,
                    lease_id=request.lease_id,
                    task_id=lease.task_id,
                    node_id=node_id,
                    policy_version=request.policy_version,
                    body_sha256=body_sha256,
                    body_json=canonical_json(document).decode(),
                    worker_signature=worker_signature,
                    submitted_at=now,
                    status="pending",
                )
            )
            conn.execute(update(leases).where(leases.c.lease_id == request.lease_id).values(state="submitted"))
            conn.execute(update(tasks).where(tasks.c.task_id == lease.task_id).values(state="submitted"))
            self._event(
                conn,
                "submit",
                node_id,
                submission_id,
                lease_id=request.lease_id,
                task_id=lease.task_id,
                policy_version=request.policy_version,
                engine=request.engine,
            )
        return SubmitResponse(submission_id=submission_id, status="pending", duplicate=False)

    @staticmethod
    def _check_lease_open(lease: Row[Any], task: Row[Any]) -> None:
        """A lease may be submitted while active (even just past its deadline, until maintenance expires it),
        or after expiry as long as nobody else took the task meanwhile."""
        if lease.state == "abandoned":
            raise ConflictError(f"lease {lease.lease_id} was abandoned; lease a new task")
        if lease.state == "expired" and task.state != "open":
            raise ConflictError(
                f"lease {lease.lease_id} expired and task {task.task_id} was re-issued; renew leases before "
                "their deadline"
            )

    def pending(self, validator_id: str, limit: int, nonce: NonceClaim | None = None) -> PendingSubmissions:
        with self._write(nonce) as conn:
            self._node(conn, validator_id, "validator")
            self._touch(conn, validator_id)
        with self.db.read() as conn:
            rows = conn.execute(
                select(submissions)
                .where(submissions.c.status == "pending")
                .order_by(submissions.c.submitted_at)
                .limit(limit)
            ).all()
            found = [
                PendingSubmission(
                    submission_id=row.submission_id,
                    worker_id=row.node_id,
                    task=self._task_view(
                        conn.execute(select(tasks).where(tasks.c.task_id == row.task_id)).one(),
                        conn.execute(select(leases).where(leases.c.lease_id == row.lease_id)).one(),
                    ),
                    submission=SubmitRequest.model_validate_json(row.body_json),
                    submitted_at=row.submitted_at,
                    worker_signature_b64=row.worker_signature,
                )
                for row in rows
            ]
        return PendingSubmissions(submissions=found)

    def post_verdict(self, validator_id: str, verdict: Verdict, nonce: NonceClaim | None = None) -> VerdictResponse:
        now = self.clock()
        with self._write(nonce) as conn:
            self._node(conn, validator_id, "validator")
            sub = conn.execute(
                select(submissions).where(submissions.c.submission_id == verdict.submission_id).with_for_update()
            ).first()
            if sub is None:
                raise NotFoundError(f"no submission {verdict.submission_id!r}")
            num_rollouts = len(json.loads(sub.body_json)["rollouts"])
            if verdict.rewards and len(verdict.rewards) != num_rollouts:
                raise ProtocolError(f"{len(verdict.rewards)} rewards for {num_rollouts} rollouts")
            status = "accepted" if verdict.accepted else "rejected"
            worker = conn.execute(select(nodes).where(nodes.c.node_id == sub.node_id).with_for_update()).one()
            if sub.status != "pending":
                if sub.status == status:  # the same verdict again: idempotent
                    return VerdictResponse(submission_id=sub.submission_id, status=status, worker_banned=worker.banned)
                raise ConflictError(f"submission {sub.submission_id} was already {sub.status}")
            conn.execute(
                update(submissions)
                .where(submissions.c.submission_id == sub.submission_id)
                .values(status=status, verdict_by=validator_id, verdict_at=now, verdict_json=verdict.model_dump_json())
            )
            banned = bool(worker.banned)
            if verdict.accepted:
                conn.execute(
                    insert(accepted_groups).values(
                        task_id=sub.task_id, submission_id=sub.submission_id, accepted_at=now
                    )
                )
                conn.execute(update(tasks).where(tasks.c.task_id == sub.task_id).values(state="accepted"))
                conn.execute(
                    update(nodes).where(nodes.c.node_id == sub.node_id).values(num_accepted=nodes.c.num_accepted + 1)
                )
            else:
                conn.execute(update(tasks).where(tasks.c.task_id == sub.task_id).values(state="open"))
                reason = ban_reason(self.ban_policy, worker.num_accepted, worker.num_rejected + 1, verdict.reasons)
                values: dict[str, Any] = {"num_rejected": worker.num_rejected + 1}
                if reason and not banned:
                    values.update(banned=True, ban_reason=reason)
                    banned = True
                conn.execute(update(nodes).where(nodes.c.node_id == sub.node_id).values(**values))
                if values.get("banned"):
                    self._ban_cleanup(conn, sub.node_id)
                    self._event(conn, "ban", sub.node_id, sub.node_id, reason=reason)
            self._event(
                conn,
                "verdict",
                validator_id,
                sub.submission_id,
                accepted=verdict.accepted,
                worker_id=sub.node_id,
                task_id=sub.task_id,
                reasons=verdict.reasons,
                rewards=verdict.rewards,
            )
            self._touch(conn, validator_id)
        return VerdictResponse(submission_id=sub.submission_id, status=status, worker_banned=banned)

    def _ban_cleanup(self, conn: Connection, node_id: str) -> None:
        """A banned worker's open leases go back to the queue at once."""
        for lease_id, task_id in conn.execute(
            select(leases.c.lease_id, leases.c.task_id).where(leases.c.node_id == node_id, leases.c.state == "active")
        ).all():
            self._end_lease(conn, lease_id, task_id, "abandoned")

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
                if self._end_lease(conn, lease_id, task_id, "expired"):
                    self._event(conn, "expire", node_id, lease_id, task_id=task_id, reason=f"policy moved to {version}")
            self._event(
                conn, "publish", self.coordinator_id, str(version), total_size_bytes=signed.manifest.total_size_bytes
            )
        return PublishResponse(version=version, published_at=now)
