"""Nodes and leases: the part of the ledger that hands out work.

Each public method takes an already-authenticated node id, a validated wire message and the
request's nonce, runs one transaction (which also stores the nonce and appends to the event
log), and returns a wire message or raises a :class:`~protocol.errors.RequestRefused` saying
why. It knows nothing of HTTP. The other parts of the ledger use its lease rows through
:func:`end_lease`, :func:`locked_lease` and :func:`task_view`.

Concurrency: SQLite runs one write transaction at a time (see
:mod:`coordinator.ledger.storage.engine`). On PostgreSQL a lease call locks its node's row (so the
per-node cap holds), claims open tasks with ``FOR UPDATE SKIP LOCKED`` and draws new group
indices from a sequence, so leases to different workers do not queue behind one another.
Several API replicas can share one database; the network-wide lease cap is then approximate
by at most the number of concurrent lease calls.

Sybil limits: a lease counts against its node's *source* (:mod:`coordinator.ledger.sources`), and
each live source gets a fair share of the network-wide cap, not each key; a node on probation
(:mod:`coordinator.ledger.reputation`) holds only what it has earned, and all probationary nodes of
one source share one budget of unverified work (open leases plus submissions awaiting a
verdict). All probationary leases of every source together fit in the probation pool
(``sources.probation_share`` of the cap, an equal part per source; a source that recently hoarded or
abandoned a probation lease may only use half of it) and live at most ``sources.probation_lease_max_s``,
so the pool turns over to newcomers (:func:`coordinator.ledger.scheduling.probation_pool_room`); a
node's leases that expire unsubmitted or are abandoned cost it allowance. A task never goes back to a
node that held it before, so a rejected or abandoned task is not handed straight back. On PostgreSQL
these per-source counts are, like the network-wide cap, approximate by at most the number of
concurrent lease calls from that source.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Row, bindparam, case, exists, func, insert, select, update

from coordinator.ledger.approvals import operator_approves
from coordinator.ledger.core import NODE_ROW, RUN_ROW_ID, UPDATE_NODE, LedgerCore, dumps
from coordinator.ledger.replay import NonceClaim
from coordinator.ledger.reputation import ProbationPolicy, lease_allowance, on_probation
from coordinator.ledger.resting import MAX_RESTING_SKIPS, prompt_key
from coordinator.ledger.scheduling import (
    choose_policy_version,
    grant_count,
    lease_room,
    oldest_allowed_version,
    probation_deadline,
    probation_pool_room,
    probation_pool_size,
)
from coordinator.ledger.seeds import sampling_seed
from coordinator.ledger.sources import SourcePolicy
from coordinator.ledger.storage.tables import (
    leases,
    no_signal_groups,
    nodes,
    prompt_signal,
    run_state,
    step_submissions,
    submissions,
    tasks,
)
from environments.prompts import PromptSource, SourcePrompt
from protocol.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
)
from protocol.schemas import (
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    LeaseResponse,
    LeaseState,
    Prompt,
    RegisterRequest,
    RegisterResponse,
    SamplingParams,
    Task,
)

HEARTBEAT_INTERVAL_S = 10.0
RETRY_EMPTY_S = 2.0

# The statements of every registration, heartbeat, lease and submission, built once
# (see coordinator.ledger.storage.engine).
_LEASE_ROW_LOCKED = select(leases).where(leases.c.lease_id == bindparam("b_lease_id")).with_for_update()
_ACTIVE_LEASES = select(func.count()).where(leases.c.state == "active")
_ACTIVE_LEASES_ALL_AND_OF_NODE = select(  # one scan for the network-wide cap and the node's own
    func.count(), func.coalesce(func.sum(case((leases.c.node_id == bindparam("b_node_id"), 1), else_=0)), 0)
).where(leases.c.state == "active")
_ACTIVE_LEASES_OF_SOURCE = _ACTIVE_LEASES.where(leases.c.source == bindparam("b_source"))
_PROBATION_LEASES_OF_SOURCE = _ACTIVE_LEASES_OF_SOURCE.where(leases.c.probation.is_(True))
_PROBATION_PENDING_OF_SOURCE = (
    select(func.count())
    .select_from(submissions.join(leases, submissions.c.lease_id == leases.c.lease_id))
    .where(submissions.c.status == "pending", leases.c.source == bindparam("b_source"), leases.c.probation.is_(True))
)
_PROBATION_LEASES = _ACTIVE_LEASES.where(leases.c.probation.is_(True))
FORFEIT_REASONS = ("deadline", "abandoned")
"""Why a lease ends that costs its node allowance: it let the lease expire unsubmitted, or gave it back."""
_SOURCE_FORFEITED_SINCE = select(
    exists().where(
        leases.c.source == bindparam("b_source"),
        leases.c.probation.is_(True),
        leases.c.end_reason.in_(FORFEIT_REASONS),
        leases.c.deadline >= bindparam("b_since"),
    )
)
_LIVE_WORKERS = select(nodes.c.node_id, nodes.c.ip, nodes.c.num_accepted, nodes.c.num_rejected).where(
    nodes.c.role == "worker", nodes.c.banned.is_(False), nodes.c.last_seen >= bindparam("b_live_after")
)
_HELD_BEFORE = exists().where(leases.c.task_id == tasks.c.task_id, leases.c.node_id == bindparam("b_node_id"))
_OPEN_TASKS = (
    select(tasks)
    .where(tasks.c.state == "open", ~_HELD_BEFORE)  # never straight back to a node that rejected or dropped it
    .order_by(tasks.c.group_index)
    .limit(bindparam("b_limit"))
    .with_for_update(skip_locked=True)  # PostgreSQL: concurrent leases claim different tasks
)
_INSERT_NODE = insert(nodes)
_INSERT_TASK = insert(tasks)
_INSERT_LEASE = insert(leases)
_MARK_TASK_LEASED = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("b_task_id"))
    .values(state="leased", num_leases=tasks.c.num_leases + 1)
)
_SET_NEXT_GROUP_INDEX = (
    update(run_state).where(run_state.c.id == RUN_ROW_ID).values(next_group_index=bindparam("b_next_group_index"))
)


class Leases:
    """Nodes and leases over the ledger's :class:`~coordinator.ledger.core.LedgerCore` (module docstring)."""

    def __init__(self, core: LedgerCore, prompts: PromptSource) -> None:
        self.core = core
        self.db = core.db
        self.config = core.config
        self.scheduling = core.scheduling
        self.clock = core.clock
        self.prompts = prompts
        self.sources = SourcePolicy(self.config.sources)
        self.probation = ProbationPolicy(
            new_identity_leases=self.config.sources.new_identity_leases,
            max_leases_per_node=self.scheduling.max_leases_per_node,
            proven_after_accepted=self.config.sources.proven_after_accepted,
        )
        self._next_expiry_check = 0.0
        self._live_sources = (float("-inf"), 0, 0)

    def _expire_overdue(self, conn: Connection, now: float) -> int:
        overdue = conn.execute(
            select(leases.c.lease_id, leases.c.task_id, leases.c.node_id).where(
                leases.c.state == "active", leases.c.deadline < now
            )
        ).all()
        num_expired = 0
        for lease_id, task_id, node_id in overdue:
            if end_lease(conn, lease_id, task_id, "expired", "deadline", node_id):
                self.core.event(conn, "expire", node_id, lease_id, task_id=task_id, reason="deadline passed")
                num_expired += 1
        return num_expired

    # ---- nodes ---------------------------------------------------------------------------------

    def register(
        self, node_id: str, ip: str, request: RegisterRequest, nonce: NonceClaim | None = None
    ) -> RegisterResponse:
        approved = request.role == "worker" or self.config.trust.validators_open
        if not approved:
            with self.db.read() as conn:
                approved = operator_approves(conn, node_id, self.config.trust.approved_validators)
        if not approved:
            raise ForbiddenError(
                f"validator {node_id} is not approved: ask the operator to approve it "
                "(`prime-coordinator validators approve ID`, or trust.approved_validators)"
            )
        now = self.clock()
        values = {
            "role": request.role,
            "approved": approved,
            "last_seen": now,
            "ip": ip,
            "hardware_json": request.hardware.model_dump_json(),
            "engine": request.engine,
            "software_version": request.software_version,
        }
        with self.core.write(nonce) as conn:
            row = conn.execute(NODE_ROW, {"b_node_id": node_id}).first()
            if row is not None and row.banned:
                raise ForbiddenError(f"node {node_id} is banned: {row.ban_reason}")
            if row is None:
                new_node = {"versions_held_json": "[]", "tokens_per_s": 0.0, "num_accepted": 0, "num_rejected": 0}
                new_node |= {"num_votes_agreed": 0, "num_votes_outvoted": 0, "num_forfeited": 0}
                new_node |= {"credit_samples": 0, "credit_tokens": 0, "credit_lost_samples": 0, "credit_lost_tokens": 0}
                new_node |= {"node_id": node_id, "registered_at": now, "banned": False, **values}
                conn.execute(_INSERT_NODE, new_node)
            else:
                conn.execute(UPDATE_NODE, {"b_node_id": node_id, **values})
            self.core.event(conn, "register", node_id, node_id, role=request.role, ip=ip, new=row is None)
            current = self.core.run_row(conn).current_policy_version
        return RegisterResponse(node_id=node_id, role=request.role, approved=approved, current_policy_version=current)

    def heartbeat(self, node_id: str, request: HeartbeatRequest, nonce: NonceClaim | None = None) -> HeartbeatResponse:
        values: dict[str, Any] = {
            "versions_held_json": dumps(request.policy_versions_held),
            "tokens_per_s": request.tokens_per_s,
        }
        if request.engine is not None:
            values["engine"] = request.engine
        if request.hardware is not None:
            values["hardware_json"] = request.hardware.model_dump_json()
        with self.core.write(nonce, durable=False) as conn:  # liveness is soft state
            self.core.node(conn, node_id, None, touch=values)
            current = self.core.run_row(conn).current_policy_version
        return HeartbeatResponse(current_policy_version=current, heartbeat_interval_s=HEARTBEAT_INTERVAL_S)

    # ---- leases --------------------------------------------------------------------------------

    def lease(self, node_id: str, request: LeaseRequest, nonce: NonceClaim | None = None) -> LeaseResponse:
        now = self.clock()
        with self.core.write(nonce) as conn:
            # One lease call per node at a time (its cap holds); different nodes do not wait for each other.
            node = self.core.node(conn, node_id, "worker", touch={})
            run = self.core.run_row(conn)
            if now >= self._next_expiry_check:  # at most once a second per process; maintenance does it too
                self._expire_overdue(conn, now)
                self._next_expiry_check = now + 1.0
            open_total, held = conn.execute(_ACTIVE_LEASES_ALL_AND_OF_NODE, {"b_node_id": node_id}).one()
            source = self.sources.source_of(node_id, node.ip)
            trusted = self.sources.is_allowed(node.ip)
            probation = not trusted and on_probation(self.probation, node.num_accepted, node.num_rejected)
            count = grant_count(
                request.max_tasks,
                held,
                self._node_cap(node, trusted),
                open_total,
                self.scheduling.max_open_leases,
                self._num_live_sources(conn, now, proven=not probation),
                held if trusted else conn.execute(_ACTIVE_LEASES_OF_SOURCE, {"b_source": source}).scalar_one(),
                self._probation_room(conn, source, now) if probation else None,
            )
            room = self._lease_room(conn, run.current_policy_version, run.version_floor)
            if room is not None:
                count = min(count, room)
            if count == 0:
                return LeaseResponse(tasks=[], retry_after_s=RETRY_EMPTY_S)
            task_rows: list[Any] = list(conn.execute(_OPEN_TASKS, {"b_limit": count, "b_node_id": node_id}).all())
            task_rows += self._new_tasks(conn, count - len(task_rows), now)
            if not task_rows:
                return LeaseResponse(tasks=[], retry_after_s=RETRY_EMPTY_S)
            version = choose_policy_version(
                run.current_policy_version, self.scheduling.async_level, request.policy_versions_held, run.version_floor
            )
            sampling = SamplingParams(temperature=self.scheduling.temperature, max_tokens=self.scheduling.max_tokens)
            leased = [self._issue(conn, node_id, row, version, sampling, now, source, probation) for row in task_rows]
        return LeaseResponse(tasks=leased, retry_after_s=0.0)

    def _lease_room(self, conn: Connection, current_version: int, floor: int = 0) -> int | None:
        """Leases still allowed by :func:`coordinator.ledger.scheduling.lease_room` (None: no orchestrator, no limit).

        On PostgreSQL, concurrent lease calls may each see the same room, so the bound is
        approximate by at most the number of concurrent calls (as the network-wide cap is)."""
        orchestrator = self.config.orchestrator
        if not orchestrator.enabled:
            return None
        k = self.scheduling.async_level
        oldest = oldest_allowed_version(current_version, k, floor)
        leased = conn.execute(
            select(func.count()).where(leases.c.state == "active", leases.c.policy_version >= oldest)
        ).scalar_one()
        waiting = select(func.count()).where(
            submissions.c.status.in_(("pending", "accepted")),
            submissions.c.policy_version >= oldest,
            # set aside for carrying no signal: done with, never trained
            submissions.c.submission_id.not_in(select(no_signal_groups.c.submission_id)),
        )
        if k > 0:  # with k = 0 a step's groups count until the next version is out
            waiting = waiting.where(submissions.c.submission_id.not_in(select(step_submissions.c.submission_id)))
        in_flight = leased + conn.execute(waiting).scalar_one()
        return lease_room(k, orchestrator.groups_per_step, in_flight, orchestrator.steps_ahead)

    def _node_cap(self, node: Row[Any], trusted: bool) -> int:
        """Open leases the node may hold: the per-node limit when allow-listed, else what it has earned."""
        if trusted:
            return self.scheduling.max_leases_per_node
        return lease_allowance(self.probation, node.num_accepted, node.num_rejected, node.num_forfeited)

    def _probation_room(self, conn: Connection, source: str, now: float) -> int:
        """Probation leases the source may still take: what is left of its budget (its probationary open leases and
        pending submissions) and of its part of the network-wide probation pool."""
        sources = self.config.sources
        params = {"b_source": source}
        held_by_source = conn.execute(_PROBATION_LEASES_OF_SOURCE, params).scalar_one()
        unverified = held_by_source + conn.execute(_PROBATION_PENDING_OF_SOURCE, params).scalar_one()
        forfeited = conn.execute(_SOURCE_FORFEITED_SINCE, {**params, "b_since": now - sources.forfeit_memory_s})
        pool_room = probation_pool_room(
            probation_pool_size(self.scheduling.max_open_leases, sources.probation_share),
            conn.execute(_PROBATION_LEASES).scalar_one(),
            self._num_live_sources(conn, now, proven=False),
            held_by_source,
            bool(forfeited.scalar_one()),
        )
        return int(min(sources.probation_budget - unverified, pool_room))

    def _num_live_sources(self, conn: Connection, now: float, proven: bool) -> int:
        """Sources with a live worker (``proven``: with a live worker off probation, i.e. with verified work or
        allow-listed), counted at most once a second (the fair share needs a rough figure, fast). A proven worker's
        fair share of the cap is divided among proven sources only: fresh keys from many networks cannot dilute it
        (they draw from the probation pool)."""
        counted_at, num_all, num_proven = self._live_sources
        if now - counted_at >= 1.0 or now < counted_at:
            live = conn.execute(_LIVE_WORKERS, {"b_live_after": now - self.scheduling.worker_live_s}).all()
            num_all = len({self.sources.source_of(row.node_id, row.ip) for row in live})
            num_proven = len(
                {
                    self.sources.source_of(row.node_id, row.ip)
                    for row in live
                    if self.sources.is_allowed(row.ip)
                    or not on_probation(self.probation, row.num_accepted, row.num_rejected)
                }
            )
            self._live_sources = (now, num_all, num_proven)
        return num_proven if proven else num_all

    def _next_group_index(self, conn: Connection) -> int:
        """The next prompt group to draw from the source.

        SQLite serializes writers, so a counter in run_state is enough. PostgreSQL uses a sequence
        (no row lock held until commit, so concurrent leases do not queue behind each other); an
        index drawn by a transaction that then rolls back is skipped, never reused.
        """
        if self.db.is_sqlite:
            index = int(self.core.run_row(conn).next_group_index)
            conn.execute(_SET_NEXT_GROUP_INDEX, {"b_next_group_index": index + 1})
            return index
        return int(conn.exec_driver_sql("SELECT nextval('group_index_seq')").scalar_one())

    def _new_tasks(self, conn: Connection, count: int, now: float) -> list[Any]:
        """Up to ``count`` new tasks from the prompt source, stored as leased: the lease being issued takes them."""
        created: list[Any] = []
        for _ in range(max(0, count)):
            for skipped in range(MAX_RESTING_SKIPS + 1):
                next_index = self._next_group_index(conn)
                group = self.prompts.prompt_group(next_index, self.scheduling.prompts_per_task)
                if not group or skipped == MAX_RESTING_SKIPS or not self._resting(conn, group, next_index):
                    break
            if not group:
                break
            prompts = [_stored_prompt(index, prompt) for index, prompt in enumerate(group)]
            values = {
                "task_id": f"t{next_index}",
                "group_index": next_index,
                "task_name": self.prompts.name,
                "prompts_json": dumps(prompts),
                "state": "leased",  # made for the lease being issued: _issue does not mark it again
                "num_leases": 1,
                "created_at": now,
            }
            conn.execute(_INSERT_TASK, values)
            created.append(SimpleNamespace(**values))
        return created

    def _resting(self, conn: Connection, group: Sequence[SourcePrompt], group_index: int) -> bool:
        """Whether a prompt of ``group`` rests at task ``group_index`` (:mod:`coordinator.ledger.resting`)."""
        if self.config.orchestrator.rest_after <= 0:
            return False
        keys = [prompt_key(prompt.token_ids) for prompt in group]
        found = conn.execute(
            select(prompt_signal.c.prompt_key)
            .where(prompt_signal.c.prompt_key.in_(keys), prompt_signal.c.resting_until > group_index)
            .limit(1)
        ).first()
        return found is not None

    def _issue(
        self,
        conn: Connection,
        node_id: str,
        task_row: Any,
        version: int,
        sampling: SamplingParams,
        now: float,
        source: str,
        probation: bool,
    ) -> Task:
        lease_id = f"l-{secrets.token_hex(12)}"
        seed = sampling_seed(self.core.secret, task_row.task_name, task_row.group_index, lease_id)
        deadline = now + self.scheduling.lease_ttl_s
        if probation:
            max_s = self.config.sources.probation_lease_max_s
            deadline = probation_deadline(now, now, self.scheduling.lease_ttl_s, max_s)
        values = {
            "lease_id": lease_id,
            "task_id": task_row.task_id,
            "node_id": node_id,
            "policy_version": version,
            "sampling_seed": seed,
            "group_size": self.scheduling.group_size,
            "sampling_json": sampling.model_dump_json(),
            "issued_at": now,
            "deadline": deadline,
            "state": "active",
            "source": source,
            "probation": probation,
        }
        conn.execute(_INSERT_LEASE, values)
        if task_row.state == "open":
            conn.execute(_MARK_TASK_LEASED, {"b_task_id": task_row.task_id})
        self.core.event(conn, "lease", node_id, lease_id, task_id=task_row.task_id, policy_version=version)
        return task_view(task_row, SimpleNamespace(**values))

    def _own_lease(self, conn: Connection, node_id: str, lease_id: str) -> Row[Any]:
        row = locked_lease(conn, lease_id)
        if row.node_id != node_id:
            raise ForbiddenError(f"lease {lease_id} belongs to another node")
        return row

    def renew(self, node_id: str, lease_id: str, nonce: NonceClaim | None = None) -> LeaseState:
        now = self.clock()
        with self.core.write(nonce) as conn:
            self.core.node(conn, node_id, "worker")
            row = self._own_lease(conn, node_id, lease_id)
            if row.state != "active" or row.deadline < now:
                raise ConflictError(f"lease {lease_id} cannot be renewed: {lease_end_cause(row, now)}")
            deadline = now + self.scheduling.lease_ttl_s
            if row.probation:
                max_s = self.config.sources.probation_lease_max_s
                deadline = probation_deadline(row.issued_at, now, self.scheduling.lease_ttl_s, max_s)
                if deadline <= now:
                    raise ConflictError(
                        f"lease {lease_id} cannot be renewed: a lease of an identity on probation lives at most "
                        f"{max_s:g} s (sources.probation_lease_max_s); submit it now, accepted work ends probation"
                    )
            conn.execute(update(leases).where(leases.c.lease_id == lease_id).values(deadline=deadline))
            self.core.event(conn, "renew", node_id, lease_id, deadline=deadline)
        return LeaseState(lease_id=lease_id, task_id=row.task_id, state="active", deadline=deadline)

    def abandon(self, node_id: str, lease_id: str, nonce: NonceClaim | None = None) -> LeaseState:
        with self.core.write(nonce) as conn:
            self.core.node(conn, node_id, "worker")
            row = self._own_lease(conn, node_id, lease_id)
            if row.state == "active":
                end_lease(conn, lease_id, row.task_id, "abandoned", "abandoned", node_id)
                self.core.event(conn, "abandon", node_id, lease_id, task_id=row.task_id)
                state = "abandoned"
            elif row.state == "abandoned":
                state = "abandoned"
            else:
                raise ConflictError(f"lease {lease_id} is {row.state}; only an active lease can be abandoned")
        return LeaseState(lease_id=lease_id, task_id=row.task_id, state=state, deadline=row.deadline)

    def expire_overdue(self) -> int:
        """Re-queue the tasks of leases whose deadline passed (the background maintenance calls this)."""
        with self.core.write(None) as conn:
            return self._expire_overdue(conn, self.clock())


def _stored_prompt(index: int, prompt: SourcePrompt) -> dict[str, Any]:
    """A task's prompt as the ledger stores it (its images by their hashes only, and only when it has some)."""
    stored: dict[str, Any] = {
        "prompt_index": index,
        "token_ids": list(prompt.token_ids),
        "text": prompt.text,
        "example_index": prompt.example_index,
    }
    if prompt.image_sha256:
        stored["image_sha256"] = list(prompt.image_sha256)
    return stored


def task_view(task_row: Any, lease_row: Any) -> Task:
    """The wire Task from a task's and a lease's columns (rows, or namespaces of just-inserted values)."""
    prompts = [Prompt(**prompt) for prompt in json.loads(task_row.prompts_json)]
    return Task(
        task_id=task_row.task_id,
        lease_id=lease_row.lease_id,
        task_name=task_row.task_name,
        prompts=prompts,
        group_size=lease_row.group_size,
        sampling=SamplingParams(**json.loads(lease_row.sampling_json)),
        policy_version=lease_row.policy_version,
        sampling_seed=lease_row.sampling_seed,
        deadline=lease_row.deadline,
    )


def end_lease(
    conn: Connection, lease_id: str, task_id: str, state: str, reason: str, node_id: str | None = None
) -> bool:
    """End an active lease for ``reason`` (``deadline``, ``abandoned``, ``policy``, ``banned``) and re-queue its
    task; False when it was no longer active. A reason in :data:`FORFEIT_REASONS` costs ``node_id`` allowance.

    The ``state = 'active'`` condition matters on PostgreSQL: two transactions may both have
    seen the lease overdue; the second one's UPDATE waits for the first and then matches
    nothing, so it cannot re-open a task that was meanwhile leased to someone else.
    """
    ended = conn.execute(
        update(leases)
        .where(leases.c.lease_id == lease_id, leases.c.state == "active")
        .values(state=state, end_reason=reason)
    )
    if ended.rowcount != 1:
        return False
    conn.execute(update(tasks).where(tasks.c.task_id == task_id, tasks.c.state == "leased").values(state="open"))
    if reason in FORFEIT_REASONS and node_id is not None:
        conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(num_forfeited=nodes.c.num_forfeited + 1))
    return True


def locked_lease(conn: Connection, lease_id: str) -> Row[Any]:
    """The lease's row, locked, or a 404."""
    row = conn.execute(_LEASE_ROW_LOCKED, {"b_lease_id": lease_id}).first()
    if row is None:
        raise NotFoundError(f"no lease {lease_id!r}; lease a task first")
    return row


def lease_end_cause(lease: Row[Any], now: float) -> str:
    """Why a lease is no longer active, in words its worker can act on (``end_reason``: see :func:`end_lease`)."""
    if lease.state == "active" and lease.deadline < now:
        return "it expired: its deadline passed; renew leases before their deadline"
    if lease.end_reason == "banned":
        return "its node was banned"
    if lease.state == "abandoned":
        return "it was abandoned; lease a new task"
    if lease.state == "expired" and lease.end_reason == "policy":
        return (
            f"it expired because the policy moved on: results made with version {lease.policy_version} are stale "
            "now (not a late renewal); lease a new task"
        )
    if lease.state == "expired":
        return "it expired: its deadline passed before it was renewed; renew leases before their deadline"
    return f"it is {lease.state}"
