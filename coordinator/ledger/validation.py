"""The validators' side of the ledger: what each one must audit, and turning their verdicts into decisions.

:class:`Validation` lists pending submissions to a validator (never one it already
judged), each with the samples it must re-check (:mod:`coordinator.ledger.audit_choice`), logging
a ``hand_out`` event of what it handed to whom (when each audit began, for whoever measures the
loop) and keeping each hand-out (table ``hand_outs``) for ``validation.hand_out_ttl_s``: a verdict
counts only on a submission handed to its validator within that time (any other is refused, so
public submission ids do not let a validator judge what it was never given). It records each
validator's verdict as a vote of its own (table ``verdict_votes``); the public event log says only
that the validator voted, never how or with which rewards, until the decision. When
``validation.validators_per_submission`` votes agree (:mod:`coordinator.ledger.quorum`), the
submission is decided in the same transaction: accepted groups enter ``accepted_groups`` (what
training batches are built from) with the agreeing validators' rewards; rejected ones re-open
their task and count against the worker's reputation, which may ban it; each voter's record
(``num_votes_agreed``, ``num_votes_outvoted``) is updated, and a validator flagged by it
(:func:`coordinator.ledger.reputation.validator_flagged`) is handed at most
``validation.flagged_hand_outs`` submissions per pending list. Nothing about the
worker or the accepted set changes before the decision. A vote locks the submission's row, so
concurrent validators (and API replicas) decide each submission exactly once. Stored rows are
read defensively: a vote or submission body that no longer parses (written before the wire
schema refused NaN, say) never fails a later request; see :meth:`Validation._votes`
and :meth:`Validation.pending`. Submissions nobody can audit are closed without judging their
worker (:mod:`coordinator.ledger.voiding`): an environment that cannot score them (a quorum of
``environment_error`` verdicts), and pending ones whose policy version the origin no longer keeps
(never handed out: expired before each pending list and at each publication).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Row, and_, exists, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from coordinator.ledger import reaudits
from coordinator.ledger.audit_choice import audit_sample_indices, reaudit_chosen
from coordinator.ledger.audit_policy import audit_policy, audit_share
from coordinator.ledger.audit_records import accepted_in_a_row, count_decision
from coordinator.ledger.core import LedgerCore
from coordinator.ledger.leasing import end_lease, task_view
from coordinator.ledger.quorum import Decision, Vote, agrees_with, decide
from coordinator.ledger.replay import NonceClaim
from coordinator.ledger.reputation import BanPolicy, ValidatorRecordPolicy, ban_reason
from coordinator.ledger.storage.tables import (
    accepted_groups,
    hand_outs,
    leases,
    nodes,
    submissions,
    tasks,
    verdict_votes,
)
from coordinator.ledger.views import LedgerViews
from coordinator.ledger.voiding import close_submission, expire_unauditable
from protocol import routes
from protocol.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    PrimeError,
    ProtocolError,
    ReplayedNonceError,
)
from protocol.schemas import (
    AuditPolicy,
    PendingSubmission,
    PendingSubmissions,
    SubmitRequest,
    Verdict,
    VerdictResponse,
)

log = logging.getLogger("coordinator.ledger.validation")
UNREADABLE_SUBMISSION = "ledger: the stored submission no longer passes the wire schema; the task is re-issued"
# A hand-out again (the same validator's next pending list) starts its validity anew, but keeps when it was first
# handed: a validator's claim on a submission (validation.hand_out_claim_s) runs from then, however often it asks.
_STORE_HAND_OUT = {
    "sqlite": sqlite_insert(hand_outs).on_conflict_do_update(
        index_elements=["submission_id", "validator_id"],
        set_={"expires_at": sqlite_insert(hand_outs).excluded.expires_at},
    ),
    "postgresql": postgresql_insert(hand_outs).on_conflict_do_update(
        index_elements=["submission_id", "validator_id"],
        set_={"expires_at": postgresql_insert(hand_outs).excluded.expires_at},
    ),
}


class Violation(Exception):  # noqa: N818 - carries a refusal, is not an error of its own
    """A refused submission that no honest worker makes (its lease is another node's, its task or policy
    version is not the lease's, it changes an earlier submission of the lease, its rollouts do not fit the
    task): the refusal goes back to the worker and counts against its reputation like a rejection.

    Also counted: the claims the ledger checks without a model (:func:`coordinator.ledger.scheduling.rollout_problems`:
    an empty completion, a logprob above 0, a token id outside the policy's vocabulary).

    Not counted: bad or replayed request signatures (anyone can send those in another node's name),
    stale policies and expired leases (honest races), and bodies that fail the schema (400 before the
    ledger; also what a worker of another software version may send).
    """

    def __init__(self, refusal: PrimeError) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def check_verdict_rewards(verdict: Verdict, num_rollouts: int) -> None:
    """ProtocolError unless the verdict's rewards (and each named reward) are finite, one per rollout."""
    series = {"rewards": verdict.rewards, **{f"reward {name!r}": v for name, v in verdict.reward_components.items()}}
    for label, values in series.items():
        if values and len(values) != num_rollouts:
            raise ProtocolError(f"{len(values)} {label} values for {num_rollouts} rollouts")
        if not all(math.isfinite(value) for value in values):
            raise ProtocolError(f"{label}: every value must be a finite number")
    if verdict.reward_components and not verdict.rewards:
        raise ProtocolError("named rewards without their weighted total (rewards)")
    if verdict.environment_error is not None and (verdict.accepted or verdict.rewards):
        raise ProtocolError("a verdict that the environment could not score accepts nothing and carries no rewards")


def vote_of(validator_id: str, verdict: Verdict) -> Vote:
    components = tuple((name, tuple(values)) for name, values in sorted(verdict.reward_components.items()))
    return Vote(
        validator_id,
        verdict.accepted,
        tuple(verdict.rewards),
        tuple(verdict.reasons),
        reward_components=components,
        environment_error=verdict.environment_error is not None,
    )


def _rows_by(conn: Connection, key: Any, values: list[str]) -> dict[str, Row[Any]]:
    """The rows of ``key``'s table whose ``key`` is one of ``values``, by that key (one query; none for no values)."""
    if not values:
        return {}
    return {getattr(row, key.name): row for row in conn.execute(select(key.table).where(key.in_(values))).all()}


def _in_good_standing(record: ValidatorRecordPolicy) -> Any:
    """Whether the validator a hand-out went to may hold a claim: approved, not banned and not flagged (the SQL of
    :func:`coordinator.ledger.reputation.validator_flagged`)."""
    outvoted, agreed = nodes.c.num_votes_outvoted, nodes.c.num_votes_agreed
    flagged = and_(
        outvoted >= record.flag_after_outvoted, outvoted > record.max_outvoted_fraction * (agreed + outvoted)
    )
    return exists().where(
        nodes.c.node_id == hand_outs.c.validator_id, nodes.c.approved.is_(True), nodes.c.banned.is_(False), ~flagged
    )


def _wanted_by_no_other(validator_id: str, fresh_after: float, quorum: int, record: ValidatorRecordPolicy) -> Any:
    """For a pending list, whether a submission is not already with enough other validators: its audits in flight
    (first handed since ``fresh_after`` to others in good standing, no vote from them yet) are none, or with the
    votes cast fewer than ``quorum``. Validators split the pending list instead of auditing the same submissions; a
    submission whose votes disagree is handed to one more validator at a time, and one whose validator went quiet,
    was flagged or lost its approval is shared again."""
    voted = exists().where(
        verdict_votes.c.submission_id == hand_outs.c.submission_id,
        verdict_votes.c.validator_id == hand_outs.c.validator_id,
    )
    in_flight = (
        select(func.count())
        .select_from(hand_outs)
        .where(
            hand_outs.c.submission_id == submissions.c.submission_id,
            hand_outs.c.validator_id != validator_id,
            hand_outs.c.handed_at > fresh_after,
            ~voted,
            _in_good_standing(record),
        )
        .scalar_subquery()
    )
    votes = (
        select(func.count())
        .select_from(verdict_votes)
        .where(verdict_votes.c.submission_id == submissions.c.submission_id)
        .scalar_subquery()
    )
    return or_(in_flight == 0, in_flight + votes < quorum)


class Validation:
    """Pending lists and verdicts over the ledger's :class:`~coordinator.ledger.core.LedgerCore` (module docstring)."""

    def __init__(self, core: LedgerCore, views: LedgerViews) -> None:
        self.core = core
        self.db = core.db
        self.config = core.config
        self.clock = core.clock
        self.views = views
        self.audit_policy: AuditPolicy = audit_policy(self.config.validation)
        self.ban_policy = BanPolicy(ban_after_rejections=self.config.trust.ban_after_rejections)

    def submission_audit_share(self, conn: Connection, worker: Row[Any], engine: str) -> float:
        """The share of a new submission's samples to recompute, from its worker's record now."""
        policy = self.audit_policy
        record = accepted_in_a_row(conn, worker.node_id, engine, worker.software_version) if policy.adaptive else 0
        return audit_share(policy, record, trusted=worker.node_id in policy.trusted_nodes)

    def audit_indices(self, submission_id: str, num_rollouts: int, share: float | None = None) -> list[int]:
        """The rollout positions of a submission that validators must re-check (deterministic per run): ``share``
        of them (the one fixed when it was stored; the run's fixed share for a submission stored without one)."""
        share = self.audit_policy.fixed_share if share is None else share
        return audit_sample_indices(self.core.secret, submission_id, num_rollouts, share)

    def pending(self, validator_id: str, limit: int, nonce: NonceClaim | None = None) -> PendingSubmissions:
        with self.core.write(nonce) as conn:
            node = self.core.node(conn, validator_id, "validator", touch={})
            self.expire_unauditable(conn)  # never hand out a submission whose version no validator can fetch
        if self.views.flagged(node):
            limit = min(limit, self.config.validation.flagged_hand_outs)
            if limit == 0:
                return PendingSubmissions(submissions=[])
        judged = exists().where(
            verdict_votes.c.submission_id == submissions.c.submission_id, verdict_votes.c.validator_id == validator_id
        )
        validation = self.config.validation
        wanted = [submissions.c.status == "pending", ~judged]
        if validation.hand_out_claim_s > 0:  # hand-outs claim: none the others already cover
            fresh_after = self.clock() - validation.hand_out_claim_s
            quorum = validation.validators_per_submission
            wanted.append(_wanted_by_no_other(validator_id, fresh_after, quorum, self.views.validator_record))
        with self.db.read() as conn:
            # Re-audits first (a cheat caught sooner trains on less), at most half the list; never to a flagged one.
            again = [] if self.views.flagged(node) else reaudits.pending_for(conn, validator_id, max(1, limit // 2))
            rows = conn.execute(
                select(submissions)
                .where(*wanted)
                .order_by(submissions.c.submitted_at)
                .limit(max(0, limit - len(again)))
            ).all()
            by_id = _rows_by(conn, submissions.c.submission_id, [r.submission_id for r in again])
            listed = [(by_id[r.submission_id], json.loads(r.positions_json)) for r in again if r.submission_id in by_id]
            listed += [(row, None) for row in rows]
            task_rows = _rows_by(conn, tasks.c.task_id, [row.task_id for row, _ in listed])
            lease_rows = _rows_by(conn, leases.c.lease_id, [row.lease_id for row, _ in listed])
            found = []
            unreadable = []
            for row, positions in listed:
                try:
                    submission = SubmitRequest.model_validate_json(row.body_json)
                except ValidationError:
                    if positions is None:
                        unreadable.append(row.submission_id)
                    continue
                chosen = positions or self.audit_indices(row.submission_id, len(submission.rollouts), row.audit_share)
                found.append(
                    PendingSubmission(
                        submission_id=row.submission_id,
                        worker_id=row.node_id,
                        task=task_view(task_rows[row.task_id], lease_rows[row.lease_id]),
                        submission=submission,
                        submitted_at=row.submitted_at,
                        worker_signature_b64=row.worker_signature,
                        audit_sample_indices=chosen,
                        reaudit=positions is not None,
                    )
                )
        for submission_id in unreadable:
            self._reject_unreadable(submission_id)
        if found:  # when each validator began on what: the start of its audit, for whoever measures the loop
            with self.core.write(None) as conn:
                ids = [item.submission_id for item in found]
                now = self.clock()
                expires_at = now + self.config.validation.hand_out_ttl_s
                conn.execute(
                    _STORE_HAND_OUT[conn.dialect.name],
                    [
                        {"submission_id": sid, "validator_id": validator_id, "handed_at": now, "expires_at": expires_at}
                        for sid in ids
                    ],
                )
                self.core.event(conn, "hand_out", validator_id, ids[0], submission_ids=ids)
        return PendingSubmissions(submissions=found)

    def expire_unauditable(self, conn: Connection) -> list[str]:
        """Close the pending submissions whose policy version the origin no longer keeps (see
        :mod:`coordinator.ledger.voiding`); their ids."""
        current = self.core.run_row(conn).current_policy_version
        return expire_unauditable(conn, current, self.config.policy_keep_versions, self.clock(), self.core.event)

    def _reject_unreadable(self, submission_id: str) -> None:
        """Reject a pending submission whose stored body fails today's schema (stored by an older ledger), so it
        neither fails every validator's pending list nor stays pending for good; not counted against the worker,
        whose submission passed the checks of its day."""
        log.warning("submission %s: %s", submission_id, UNREADABLE_SUBMISSION)
        with self.core.write(None) as conn:
            sub = conn.execute(
                select(submissions).where(submissions.c.submission_id == submission_id).with_for_update()
            ).first()
            if sub is None or sub.status != "pending":
                return
            final = Verdict(submission_id=submission_id, accepted=False, reasons=[UNREADABLE_SUBMISSION])
            values = {"status": "rejected", "verdict_at": self.clock(), "verdict_json": final.model_dump_json()}
            conn.execute(update(submissions).where(submissions.c.submission_id == submission_id).values(**values))
            conn.execute(update(tasks).where(tasks.c.task_id == sub.task_id).values(state="open"))
            self.core.event(
                conn,
                "verdict",
                None,
                submission_id,
                accepted=False,
                worker_id=sub.node_id,
                task_id=sub.task_id,
                reasons=final.reasons,
                rewards=[],
                validators=[],
            )

    def post_verdict(self, validator_id: str, verdict: Verdict, nonce: NonceClaim | None = None) -> VerdictResponse:
        now = self.clock()
        with self.core.write(nonce) as conn:
            self.core.node(conn, validator_id, "validator")
            sub = conn.execute(
                select(submissions).where(submissions.c.submission_id == verdict.submission_id).with_for_update()
            ).first()
            if sub is None:
                raise NotFoundError(f"no submission {verdict.submission_id!r}")
            body = json.loads(sub.body_json)  # parsed once for the whole verdict
            check_verdict_rewards(verdict, len(body["rollouts"]))
            worker = conn.execute(select(nodes).where(nodes.c.node_id == sub.node_id).with_for_update()).one()
            reaudit = reaudits.open_reaudit(conn, sub.submission_id) if sub.status == "accepted" else None
            if reaudit is not None and validator_id not in reaudits.voters(reaudit):
                self._check_hand_out(conn, sub, validator_id, now)
                return self._reaudit_verdict(conn, reaudit, sub, body, worker, validator_id, verdict)
            votes = self._votes(conn, sub.submission_id)
            earlier = next((vote for vote in votes if vote.validator_id == validator_id), None)
            if earlier is not None:  # the same validator again: idempotent, never a second vote
                said = "accepted" if earlier.accepted else "rejected"
                if earlier.accepted != verdict.accepted:
                    raise ConflictError(
                        f"submission {sub.submission_id} was already {said} in this validator's earlier verdict; "
                        "a vote cannot be changed"
                    )
                return VerdictResponse(submission_id=sub.submission_id, status=sub.status, worker_banned=worker.banned)
            self._check_hand_out(conn, sub, validator_id, now)
            if sub.status != "pending":  # decided before this vote arrived: it changes nothing
                return VerdictResponse(submission_id=sub.submission_id, status=sub.status, worker_banned=worker.banned)
            conn.execute(
                insert(verdict_votes).values(
                    submission_id=sub.submission_id,
                    validator_id=validator_id,
                    accepted=verdict.accepted,
                    verdict_json=verdict.model_dump_json(),
                    posted_at=now,
                )
            )
            # That it voted, never how: a vote (and its rewards) made public before the decision could be copied.
            self.core.event(conn, "vote", validator_id, sub.submission_id, worker_id=sub.node_id)
            all_votes = [*votes, vote_of(validator_id, verdict)]
            decision = decide(all_votes, self.config.validation.validators_per_submission)
            if decision is None:
                self.core.touch(conn, validator_id)
                return VerdictResponse(submission_id=sub.submission_id, status="pending", worker_banned=worker.banned)
            banned = self._decide(conn, sub, body, worker, decision, validator_id, now, all_votes)
        status = "environment_error" if decision.environment_error else "accepted" if decision.accepted else "rejected"
        return VerdictResponse(submission_id=sub.submission_id, status=status, worker_banned=banned)

    def _check_hand_out(self, conn: Connection, sub: Row[Any], validator_id: str, now: float) -> None:
        """Refuse a first vote on a submission the ledger never handed to this validator, or whose hand-out lapsed."""
        expires_at = conn.execute(
            select(hand_outs.c.expires_at).where(
                hand_outs.c.submission_id == sub.submission_id, hand_outs.c.validator_id == validator_id
            )
        ).scalar()
        if expires_at is None:
            raise ForbiddenError(
                f"submission {sub.submission_id} was never handed to validator {validator_id}: a verdict counts only "
                f"on a submission from the validator's own GET {routes.SUBMISSIONS_PENDING}"
            )
        if expires_at < now and sub.status == "pending":
            raise ConflictError(
                f"the hand-out of submission {sub.submission_id} to this validator lapsed {now - expires_at:.0f} s "
                f"ago (validation.hand_out_ttl_s); take it from GET {routes.SUBMISSIONS_PENDING} again"
            )

    def record_violation(self, node_id: str, reason: str, nonce: NonceClaim | None) -> None:
        """Count a refused cheat against the node (it may ban it), once per signed request (nonce)."""
        try:
            with self.core.write(nonce) as conn:
                worker = conn.execute(select(nodes).where(nodes.c.node_id == node_id).with_for_update()).one()
                if worker.banned:
                    return
                self.core.event(conn, "violation", node_id, node_id, reason=reason)
                self._count_rejection(conn, worker, [f"refused at the door: {reason}"])
        except ReplayedNonceError:  # the same signed request again: counted already
            return

    def _count_rejection(self, conn: Connection, worker: Row[Any], reasons: list[str]) -> bool:
        """One more rejection for the worker; bans it at the policy's count. True when it is (now) banned."""
        banned = bool(worker.banned)
        reason = ban_reason(self.ban_policy, worker.num_accepted, worker.num_rejected + 1, reasons)
        values: dict[str, Any] = {"num_rejected": worker.num_rejected + 1}
        if reason and not banned:
            values.update(banned=True, ban_reason=reason)
            banned = True
        conn.execute(update(nodes).where(nodes.c.node_id == worker.node_id).values(**values))
        if values.get("banned"):
            self._ban_cleanup(conn, worker.node_id)
            self.core.event(conn, "ban", worker.node_id, worker.node_id, reason=reason)
        return banned

    @staticmethod
    def _votes(conn: Connection, submission_id: str) -> list[Vote]:
        """The submission's votes, oldest first. A stored verdict that no longer parses (rewards of NaN, stored
        as null before the schema refused them) still counts as its validator's vote, with the accept flag of
        its row: a rejection stays a rejection; an acceptance keeps no rewards, so it agrees with no other
        (as its NaN rewards never did) and the submission is decided by the other validators' votes."""
        rows = conn.execute(
            select(verdict_votes)
            .where(verdict_votes.c.submission_id == submission_id)
            .order_by(verdict_votes.c.posted_at, verdict_votes.c.validator_id)
        ).all()
        votes = []
        for row in rows:
            try:
                verdict = Verdict.model_validate_json(row.verdict_json)
            except ValidationError:
                reason = "ledger: this validator's stored verdict is unreadable"
                votes.append(Vote(row.validator_id, bool(row.accepted), (), (reason,), readable=False))
                continue
            votes.append(vote_of(row.validator_id, verdict))
        return votes

    def _decide(
        self,
        conn: Connection,
        sub: Row[Any],
        body: dict[str, Any],
        worker: Row[Any],
        decision: Decision,
        validator_id: str,
        now: float,
        all_votes: list[Vote],
    ) -> bool:
        """Apply the final decision on a submission and each voter's record; True when its worker is (now) banned."""
        outvoted = sorted({vote.validator_id for vote in all_votes if not agrees_with(vote, decision)})
        # One order of row updates, so concurrent decisions on PostgreSQL never deadlock on each other's voters.
        for voter in sorted({vote.validator_id for vote in all_votes}):
            column = nodes.c.num_votes_outvoted if voter in outvoted else nodes.c.num_votes_agreed
            values: dict[str, Any] = {column.name: column + 1}
            if voter == validator_id:
                values["last_seen"] = now
            conn.execute(update(nodes).where(nodes.c.node_id == voter).values(**values))
        if decision.environment_error:  # not the worker's doing: neither counted nor trained on
            voters = tuple(vote.validator_id for vote in decision.votes)
            close_submission(
                conn, sub, "environment_error", decision.reasons, now, self.core.event, validator_id, voters
            )
            return bool(worker.banned)
        final = Verdict(
            submission_id=sub.submission_id,
            accepted=decision.accepted,
            reasons=decision.reasons[:64],
            rewards=decision.rewards,
            reward_components=decision.reward_components,
        )
        status = "accepted" if decision.accepted else "rejected"
        conn.execute(
            update(submissions)
            .where(submissions.c.submission_id == sub.submission_id)
            .values(status=status, verdict_by=validator_id, verdict_at=now, verdict_json=final.model_dump_json())
        )
        banned = bool(worker.banned)
        accepted_one = {"num_accepted": nodes.c.num_accepted + 1} if decision.accepted else None
        count_decision(conn, body, worker, decision.accepted, also=accepted_one)
        if decision.accepted:
            conn.execute(
                insert(accepted_groups).values(task_id=sub.task_id, submission_id=sub.submission_id, accepted_at=now)
            )
            self._maybe_reaudit(conn, sub, len(body["rollouts"]), now)
            conn.execute(update(tasks).where(tasks.c.task_id == sub.task_id).values(state="accepted"))
        else:
            conn.execute(update(tasks).where(tasks.c.task_id == sub.task_id).values(state="open"))
            banned = self._count_rejection(conn, worker, final.reasons)
        self.core.event(
            conn,
            "verdict",
            validator_id,
            sub.submission_id,
            accepted=decision.accepted,
            worker_id=sub.node_id,
            task_id=sub.task_id,
            reasons=final.reasons,
            rewards=final.rewards,
            validators=[vote.validator_id for vote in decision.votes],
            outvoted=outvoted,
        )
        return banned

    def _maybe_reaudit(self, conn: Connection, sub: Row[Any], num_rollouts: int, now: float) -> None:
        """Schedule a later audit of the samples of an accepted submission nobody recomputed (the keyed coin)."""
        share = self.audit_policy.reaudit_share
        if share <= 0 or not reaudit_chosen(self.core.secret, sub.submission_id, share):
            return
        checked = set(self.audit_indices(sub.submission_id, num_rollouts, sub.audit_share))
        unchecked = [position for position in range(num_rollouts) if position not in checked]
        if unchecked:
            reaudits.schedule(conn, sub, unchecked, now)

    def _reaudit_verdict(
        self,
        conn: Connection,
        row: Row[Any],
        sub: Row[Any],
        body: dict[str, Any],
        worker: Row[Any],
        validator_id: str,
        verdict: Verdict,
    ) -> VerdictResponse:
        """A validator's vote on a re-audit; a failed one catches the worker after the fact (module docstring)."""
        now = self.clock()
        outcome = reaudits.vote(conn, row, validator_id, verdict, self.config.validation.validators_per_submission, now)
        self.core.touch(conn, validator_id)
        banned = bool(worker.banned)
        if outcome == "failed":
            reason = f"re-audit of accepted submission {sub.submission_id} failed: {'; '.join(verdict.reasons[:3])}"
            count_decision(conn, body, worker, accepted=False)
            voided = reaudits.void_untrained(conn, worker.node_id, reason, now)
            banned = self._count_rejection(conn, worker, [reason])
            self.core.event(
                conn,
                "reaudit",
                validator_id,
                sub.submission_id,
                worker_id=worker.node_id,
                passed=False,
                reasons=verdict.reasons[:8],
                voided=voided,
            )
        elif outcome == "passed":
            self.core.event(conn, "reaudit", validator_id, sub.submission_id, worker_id=worker.node_id, passed=True)
        status = "rejected" if outcome == "failed" else "accepted"
        return VerdictResponse(submission_id=sub.submission_id, status=status, worker_banned=banned)

    def caught_by_trainer(self, submission_ids: list[str], reason: str) -> list[str]:
        """The trainer's replay found tokens of these accepted submissions that are not the policy's draw: each
        worker is caught as by a failed re-audit (its record starts over, its credit is lost, the rejection counts
        toward its ban, its untrained work is voided), and the validators that accepted them count as outvoted.
        The submissions themselves leave their step when it is rebuilt. Returns the ids caught now (those still
        accepted)."""
        caught = []
        now = self.clock()
        with self.core.write(None) as conn:
            for submission_id in sorted(set(submission_ids)):
                sub = conn.execute(
                    select(submissions).where(submissions.c.submission_id == submission_id).with_for_update()
                ).first()
                if sub is None or sub.status != "accepted":
                    continue
                worker = conn.execute(select(nodes).where(nodes.c.node_id == sub.node_id).with_for_update()).one()
                count_decision(conn, json.loads(sub.body_json), worker, accepted=False)
                voided = reaudits.void_untrained(conn, worker.node_id, reason, now)
                self._count_rejection(conn, worker, [reason])
                accepting = conn.execute(
                    select(verdict_votes.c.validator_id).where(
                        verdict_votes.c.submission_id == submission_id, verdict_votes.c.accepted
                    )
                ).scalars()
                for voter in sorted(accepting):
                    column = {"num_votes_outvoted": nodes.c.num_votes_outvoted + 1}
                    conn.execute(update(nodes).where(nodes.c.node_id == voter).values(**column))
                self.core.event(
                    conn,
                    "reaudit",
                    self.core.coordinator_id,
                    submission_id,
                    worker_id=worker.node_id,
                    passed=False,
                    caught_by="trainer",
                    reasons=[reason],
                    voided=voided,
                )
                caught.append(submission_id)
        return caught

    def _ban_cleanup(self, conn: Connection, node_id: str) -> None:
        """A banned worker's open leases go back to the queue at once."""
        for lease_id, task_id in conn.execute(
            select(leases.c.lease_id, leases.c.task_id).where(leases.c.node_id == node_id, leases.c.state == "active")
        ).all():
            end_lease(conn, lease_id, task_id, "abandoned", "banned")
