"""The ledger API end to end in-process: the worker and validator loops, scheduling rules, trust rules."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from sqlalchemy import func, select

from coordinator.ledger.seeds import sampling_seed
from coordinator.ledger.storage.tables import accepted_groups
from protocol import routes
from protocol.errors import ConflictError, ForbiddenError, StalePolicyError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import HeartbeatRequest, LeaseRequest, Verdict
from protocol.signing import verify_document
from tests.support.ledger_helpers import register_request, signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio


async def test_worker_and_validator_loop(harness: LedgerHarness, worker: LedgerClient) -> None:
    beat = await worker.heartbeat(HeartbeatRequest(policy_versions_held=[0], tokens_per_s=12.5))
    assert beat.current_policy_version == 0
    leased = await worker.lease(LeaseRequest(max_tasks=1))
    (task,) = leased.tasks
    assert task.group_size == 2 and len(task.prompts) == 2 and task.policy_version == 0
    assert task.deadline > harness.clock.now
    answer = await worker.submit(submission_for(task))
    assert (answer.status, answer.duplicate) == ("pending", False)

    validator = await harness.validator()
    (pending,) = (await validator.pending()).submissions
    assert pending.submission_id == answer.submission_id and pending.worker_id == worker.identity.node_id
    assert pending.task.sampling_seed == task.sampling_seed and pending.task.prompts == task.prompts
    # The worker's own signature over the submission travels to the validator, checkable without the coordinator.
    verify_document(pending.worker_id, pending.submission.model_dump(mode="json"), pending.worker_signature_b64)

    judged = await validator.post_verdict(Verdict(submission_id=answer.submission_id, accepted=True, rewards=[1.0] * 4))
    assert (judged.status, judged.worker_banned) == ("accepted", False)
    status = await worker.status()
    assert (status.num_submissions_accepted, status.num_submissions_pending, status.num_workers_live) == (1, 0, 1)
    kinds = [event.kind for event in (await worker.events()).events]
    assert kinds == ["register", "lease", "submit", "register", "hand_out", "vote", "verdict"]
    stats = await worker.stats()
    assert {node.node_id: node.num_accepted for node in stats.nodes}[worker.identity.node_id] == 1
    await validator.aclose()


async def test_duplicate_submission_is_idempotent_and_counted_once(
    harness: LedgerHarness, worker: LedgerClient
) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    first = await worker.submit(submission_for(task))
    again = await worker.submit(submission_for(task))
    assert again.duplicate and again.submission_id == first.submission_id
    with pytest.raises(ConflictError, match="other content"):
        await worker.submit(submission_for(task, engine="vllm"))
    validator = await harness.validator()
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=first.submission_id, accepted=True))
    repeat = await validator.post_verdict(Verdict(submission_id=first.submission_id, accepted=True))
    assert repeat.status == "accepted"
    with pytest.raises(ConflictError, match="already accepted"):
        await validator.post_verdict(Verdict(submission_id=first.submission_id, accepted=False))
    assert (await worker.submit(submission_for(task))).duplicate
    with harness.database.read() as conn:
        assert conn.execute(select(func.count()).select_from(accepted_groups)).scalar_one() == 1
    assert (await worker.status()).num_submissions_accepted == 1
    await validator.aclose()


async def test_expired_lease_is_reissued_and_late_submit_refused(harness: LedgerHarness, worker: LedgerClient) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    harness.clock.advance(harness.config.scheduling.lease_ttl_s + 1)
    other = await harness.worker()
    (reissued,) = (await other.lease(LeaseRequest())).tasks
    assert reissued.task_id == task.task_id and reissued.lease_id != task.lease_id
    assert reissued.sampling_seed != task.sampling_seed  # a fresh draw: the first lease's rollouts do not replay
    with pytest.raises(ConflictError, match="re-issued"):
        await worker.submit(submission_for(task))
    with pytest.raises(ConflictError, match="expired"):
        await worker.renew(task.lease_id)
    assert (await other.submit(submission_for(reissued))).status == "pending"
    assert "expire" in [event.kind for event in (await worker.events()).events]
    await other.aclose()


async def test_late_submit_accepted_while_nobody_else_took_the_task(
    harness: LedgerHarness, worker: LedgerClient
) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    harness.clock.advance(harness.config.scheduling.lease_ttl_s + 1)
    assert harness.ledger.expire_overdue() == 1
    assert (await worker.submit(submission_for(task))).status == "pending"


async def test_renew_extends_and_abandon_reissues(harness: LedgerHarness, worker: LedgerClient) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    harness.clock.advance(10)
    renewed = await worker.renew(task.lease_id)
    assert renewed.deadline == pytest.approx(task.deadline + 10)
    abandoned = await worker.abandon(task.lease_id)
    assert abandoned.state == "abandoned"
    assert (await worker.abandon(task.lease_id)).state == "abandoned"
    with pytest.raises(ConflictError, match="abandoned"):
        await worker.submit(submission_for(task))
    other = await harness.worker()
    (again,) = (await other.lease(LeaseRequest())).tasks
    assert again.task_id == task.task_id
    await other.aclose()


async def test_rejected_group_is_reissued(harness: LedgerHarness, worker: LedgerClient) -> None:
    (task,) = (await worker.lease(LeaseRequest())).tasks
    answer = await worker.submit(submission_for(task))
    validator = await harness.validator()
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=answer.submission_id, accepted=False, reasons=["bad proof"]))
    (fresh,) = (await worker.lease(LeaseRequest())).tasks
    assert fresh.task_id != task.task_id  # never straight back to the worker it was rejected from
    other = await harness.worker()
    (again,) = (await other.lease(LeaseRequest())).tasks
    assert again.task_id == task.task_id
    await validator.aclose()
    await other.aclose()


async def test_per_node_cap_and_fair_share(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__max_leases_per_node=3, scheduling__max_open_leases=4)
    first = await harness.worker()
    assert len((await first.lease(LeaseRequest(max_tasks=10))).tasks) == 3  # per-node cap
    empty = await first.lease(LeaseRequest(max_tasks=1))
    assert empty.tasks == [] and empty.retry_after_s > 0
    second = await harness.worker()
    # Network cap 4 with two live workers: a fair share is 2 each, and only 1 slot is left.
    assert len((await second.lease(LeaseRequest(max_tasks=10))).tasks) == 1
    task_ids = {event.subject for event in (await first.events()).events if event.kind == "lease"}
    assert len(task_ids) == 4
    await first.aclose()
    await second.aclose()


async def test_seeds_are_distinct_and_survive_reopening(harness: LedgerHarness, make_harness: MakeHarness) -> None:
    worker = await harness.worker()
    tasks = (await worker.lease(LeaseRequest(max_tasks=2))).tasks
    assert len({task.sampling_seed for task in tasks}) == 2
    # Same database, a new coordinator process: the run secret (and so every seed) is the same.
    reopened = make_harness()
    assert reopened.ledger.core.secret == harness.ledger.core.secret
    await worker.abandon(tasks[0].lease_id)
    again_client = await reopened.worker()  # another worker: a task never goes straight back to who dropped it
    (again,) = (await again_client.lease(LeaseRequest())).tasks
    # The abandoned task comes back under a new lease with a fresh seed: its old draws replay to nothing.
    assert again.task_id == tasks[0].task_id and again.sampling_seed != tasks[0].sampling_seed
    group_index = int(again.task_id.removeprefix("t"))
    assert again.sampling_seed == sampling_seed(
        reopened.ledger.core.secret, again.task_name, group_index, again.lease_id
    )
    await worker.aclose()
    await again_client.aclose()


async def test_stale_policy_is_refused_with_reason(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__async_level=1)
    worker = await harness.worker()
    (task,) = (await worker.lease(LeaseRequest())).tasks
    coordinator = harness.client(harness.coordinator)
    for version in (1, 2):
        await coordinator.publish(signed_manifest(harness.coordinator, version))
    with pytest.raises(StalePolicyError, match="oldest accepted is 1"):
        await worker.submit(submission_for(task))
    # A worker holding version 1 keeps working on it (async level 1), one holding nothing gets 2.
    (on_held,) = (await worker.lease(LeaseRequest(policy_versions_held=[0, 1]))).tasks
    assert on_held.policy_version == 1
    (on_current,) = (await worker.lease(LeaseRequest())).tasks
    assert on_current.policy_version == 2
    with pytest.raises(ConflictError, match="is for policy version 1, not 2"):
        await worker.submit(submission_for(on_held, policy_version=2))
    await worker.aclose()
    await coordinator.aclose()


async def test_publish_is_coordinator_only_and_monotonic(harness: LedgerHarness, worker: LedgerClient) -> None:
    coordinator = harness.client(harness.coordinator)
    published = await coordinator.publish(signed_manifest(harness.coordinator, 1))
    assert published.version == 1
    fetched = await worker.manifest(1)
    verify_document(harness.coordinator.node_id, fetched.manifest.model_dump(mode="json"), fetched.signature_b64)
    assert (await worker.manifest()).manifest.version == 1
    assert (await worker.status()).current_policy_version == 1
    with pytest.raises(ForbiddenError, match="only the coordinator"):
        await worker.publish(signed_manifest(worker.identity, 2))
    with pytest.raises(ConflictError, match="not newer"):
        await coordinator.publish(signed_manifest(harness.coordinator, 1))
    await coordinator.aclose()


async def test_validators_need_approval_unless_open(make_harness: MakeHarness) -> None:
    approved = NodeIdentity.generate()
    harness = make_harness(trust__validators_open=False, trust__approved_validators=[approved.node_id])
    stranger = harness.client()
    with pytest.raises(ForbiddenError, match="not approved"):
        await stranger.register(register_request("validator"))
    validator = harness.client(approved)
    assert (await validator.register(register_request("validator"))).approved
    assert (await validator.pending()).submissions == []
    worker = await harness.worker()
    with pytest.raises(ForbiddenError, match="this call is for a validator"):
        await worker.pending()
    with pytest.raises(ForbiddenError, match="this call is for a worker"):
        await validator.lease(LeaseRequest())
    for client in (stranger, validator, worker):
        await client.aclose()


async def test_repeated_rejections_ban_the_worker_with_a_reason(make_harness: MakeHarness) -> None:
    harness = make_harness(trust__ban_after_rejections=2)
    worker = await harness.worker()
    validator = await harness.validator()
    banned = False
    for _ in range(2):
        (task,) = (await worker.lease(LeaseRequest())).tasks
        answer = await worker.submit(submission_for(task))
        verdict = Verdict(submission_id=answer.submission_id, accepted=False, reasons=["proof mismatch"])
        await validator.pending(limit=256)
        banned = (await validator.post_verdict(verdict)).worker_banned
    assert banned
    with pytest.raises(ForbiddenError, match=r"banned: 2 submissions rejected.*proof mismatch"):
        await worker.lease(LeaseRequest())
    with pytest.raises(ForbiddenError, match="banned"):
        await worker.register(register_request("worker"))
    kinds = [event.kind for event in (await worker.events(limit=1000)).events]
    assert kinds.count("ban") == 1
    stats = await worker.stats()
    (row,) = [node for node in stats.nodes if node.node_id == worker.identity.node_id]
    assert row.banned and row.num_rejected == 2
    await worker.aclose()
    await validator.aclose()


async def test_public_endpoints(harness: LedgerHarness, worker: LedgerClient) -> None:
    raw = worker._client
    assert (await raw.get("/healthz")).json() == {"status": "ok"}
    await worker.lease(LeaseRequest())
    metrics = (await raw.get("/metrics")).text
    assert 'prime_ledger_requests_total{method="POST",route="/v1/leases",status="200"} 1.0' in metrics
    assert "prime_ledger_tasks_open 1.0" in metrics
    schema = (await raw.get("/openapi.json")).json()
    assert {"/v1/leases", "/v1/submissions", "/v1/verdicts", "/v1/policy-versions"} <= set(schema["paths"])


def test_the_app_serves_every_shared_path_and_no_other_under_v1(harness: LedgerHarness) -> None:
    served = {route.path for route in harness.app.routes if isinstance(route, APIRoute)}
    shared = {value for name, value in vars(routes).items() if name.isupper() and name != "PREFIX"}
    # GET /v1/p2p is mounted beside the ledger's routes by the coordinator's gossip (coordinator.serving.p2p).
    assert {path for path in served if path.startswith(routes.PREFIX)} == shared - {routes.P2P}
