"""The orchestrator's ledger record (batch selection, each accepted group used once) and the lease rule.

On SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from coordinator.ledger.batches import BatchRules, task_prompt
from coordinator.ledger.storage.tables import step_submissions
from coordinator.ledger.train_steps import min_policy_version
from protocol.ledger_client import LedgerClient
from protocol.schemas import LeaseRequest, Verdict
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness

pytestmark = pytest.mark.anyio


async def judged(
    harness: LedgerHarness,
    worker: LedgerClient,
    validator: LedgerClient,
    accepted: bool = True,
    reward: float = 0.5,
    spread: bool = True,
) -> str:
    """Lease one task, submit it and post a verdict (with a reward per rollout: ``reward`` plus 0.1 a rollout, or
    all ``reward`` without ``spread``, a group with no signal); returns the submission id."""
    (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    answer = await worker.submit(submission_for(task))
    num_rollouts = len(task.prompts) * task.group_size
    rewards = [reward + (0.1 * i if spread else 0.0) for i in range(num_rollouts)] if accepted else []
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=answer.submission_id, accepted=accepted, rewards=rewards))
    harness.clock.advance(1.0)
    return answer.submission_id


async def test_batches_take_accepted_groups_oldest_first_and_each_once(harness: LedgerHarness) -> None:
    worker, validator = await harness.worker(), await harness.validator()
    steps = harness.ledger.train_steps
    first, second = await judged(harness, worker, validator), await judged(harness, worker, validator)
    await judged(harness, worker, validator, accepted=False)
    (pending_task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    await worker.submit(submission_for(pending_task))
    third = await judged(harness, worker, validator)

    one = steps.record_batch(1, groups_per_step=2, min_version=0)
    assert one is not None and one.submission_ids == [first, second] and one.state == "recorded"
    # Recording the same step again returns the recorded batch, never a new one.
    again = steps.record_batch(1, groups_per_step=3, min_version=0)
    assert again is not None and again.submission_ids == [first, second]
    # Only `third` is left unused: too few for step 2 (rejected and pending ones never count).
    assert steps.record_batch(2, groups_per_step=2, min_version=0) is None
    fourth = await judged(harness, worker, validator)
    two = steps.record_batch(2, groups_per_step=2, min_version=0)
    assert two is not None and two.submission_ids == [third, fourth]
    # The table itself refuses a submission in two steps.
    with pytest.raises(IntegrityError), harness.database.write() as conn:
        conn.execute(insert(step_submissions).values(submission_id=first, step=2, position=9))
    await worker.aclose()
    await validator.aclose()


async def test_batches_skip_groups_older_than_the_async_level_allows(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__async_level=1)
    worker, validator = await harness.worker(), await harness.validator()
    coordinator = harness.client(harness.coordinator)
    old = await judged(harness, worker, validator)  # made with v0
    for version in (1, 2):
        await coordinator.publish(signed_manifest(harness.coordinator, version))
    fresh = await judged(harness, worker, validator)  # made with v2
    steps = harness.ledger.train_steps
    # Step 3 trains policy v2; with k = 1 it may learn from v1 and v2 only.
    assert min_policy_version(3, 1) == 1
    record = steps.record_batch(3, groups_per_step=1, min_version=min_policy_version(3, 1))
    assert record is not None and record.submission_ids == [fresh]
    assert steps.record_batch(4, groups_per_step=1, min_version=min_policy_version(4, 1)) is None
    assert old not in record.submission_ids
    for client in (worker, validator, coordinator):
        await client.aclose()


async def test_recorded_batch_is_rebuilt_after_a_restart(make_harness: MakeHarness) -> None:
    harness = make_harness()
    worker, validator = await harness.worker(), await harness.validator()
    ids = [await judged(harness, worker, validator, reward=0.2) for _ in range(2)]
    recorded = harness.ledger.train_steps.record_batch(1, groups_per_step=2, min_version=0)
    assert recorded is not None
    reopened = make_harness().ledger.train_steps  # same database, a new coordinator process
    record = reopened.step(1)
    assert record is not None and record.submission_ids == ids
    groups = reopened.groups(1)
    assert [g.submission_id for g in groups] == ids
    # Prompt tokens come from the ledger's task, rewards from the verdict, in rollout order.
    (task_prompts,) = {tuple(sorted(g.prompt_token_ids)) for g in groups}
    assert task_prompts == (0, 1)
    assert groups[0].rewards == pytest.approx([0.2, 0.3, 0.4, 0.5])
    assert reopened.trained_progress() == (0, {})  # recorded, not trained yet
    reopened.mark_trained(1, {"loss": 0.5, "batch_reward_mean": 0.35})
    assert reopened.trained_progress() == (1, {"loss": 0.5, "batch_reward_mean": 0.35})
    assert reopened.num_published() == 0
    reopened.mark_published(1)
    assert reopened.num_published() == 1
    assert harness.ledger.status().num_train_steps_done == 1
    (step,) = reopened.steps()
    assert (step.state, step.metrics["loss"]) == ("published", 0.5)
    kinds = [(e.kind, e.data.get("state")) for e in harness.ledger.events(0, 1000).events if e.kind == "train_step"]
    assert kinds == [("train_step", "recorded"), ("train_step", "trained"), ("train_step", "published")]
    await worker.aclose()
    await validator.aclose()


async def test_on_policy_leasing_stops_at_one_steps_worth_until_the_next_version(make_harness: MakeHarness) -> None:
    harness = make_harness(
        scheduling__async_level=0,
        scheduling__max_leases_per_node=8,
        orchestrator__enabled=True,
        orchestrator__groups_per_step=2,
    )
    worker, validator = await harness.worker(), await harness.validator()
    coordinator = harness.client(harness.coordinator)
    leased = (await worker.lease(LeaseRequest(max_tasks=5))).tasks
    assert len(leased) == 2
    assert (await worker.lease(LeaseRequest(max_tasks=5))).tasks == []
    # A rejected group frees its place; an accepted one keeps it.
    answers = [await worker.submit(submission_for(task)) for task in leased]
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=answers[0].submission_id, accepted=False, reasons=["bad"]))
    await validator.post_verdict(Verdict(submission_id=answers[1].submission_id, accepted=True, rewards=[1.0] * 4))
    other = await harness.worker()  # the rejected task goes to another worker, never straight back
    (retry,) = (await other.lease(LeaseRequest(max_tasks=5))).tasks
    assert retry.task_id == leased[0].task_id
    assert (await worker.lease(LeaseRequest(max_tasks=5))).tasks == []
    await other.aclose()
    # The next version opens the next step's worth.
    await coordinator.publish(signed_manifest(harness.coordinator, 1))
    fresh = (await worker.lease(LeaseRequest(max_tasks=5))).tasks
    assert len(fresh) == 2 and {task.policy_version for task in fresh} == {1}
    for client in (worker, validator, coordinator):
        await client.aclose()


@pytest.mark.parametrize(("steps_ahead", "window"), [(None, 6), (1, 2)])
async def test_async_leasing_runs_ahead_of_training_by_k_plus_one_steps(
    make_harness: MakeHarness, steps_ahead: int | None, window: int
) -> None:
    harness = make_harness(
        scheduling__async_level=2,
        scheduling__max_leases_per_node=16,
        orchestrator__enabled=True,
        orchestrator__groups_per_step=2,
        orchestrator__steps_ahead=steps_ahead,
    )
    worker, validator = await harness.worker(), await harness.validator()
    coordinator = harness.client(harness.coordinator)
    leased = (await worker.lease(LeaseRequest(max_tasks=10))).tasks
    # (k + 1) steps' worth, whatever the trainer does meanwhile; steps_ahead = 1: the next step's worth only
    assert len(leased) == window
    answers = [await worker.submit(submission_for(task)) for task in leased[:2]]
    await validator.pending(limit=256)
    for answer in answers:
        await validator.post_verdict(Verdict(submission_id=answer.submission_id, accepted=True, rewards=[1.0] * 4))
    assert (await worker.lease(LeaseRequest(max_tasks=10))).tasks == []
    # A step takes two groups: two places free up at once, before any new version.
    assert harness.ledger.train_steps.record_batch(1, groups_per_step=2, min_version=0) is not None
    assert len((await worker.lease(LeaseRequest(max_tasks=10))).tasks) == 2
    # Versions moving past what the leases were for free their places too.
    for version in (1, 2, 3):
        await coordinator.publish(signed_manifest(harness.coordinator, version))
    assert len((await worker.lease(LeaseRequest(max_tasks=10))).tasks) == window
    for client in (worker, validator, coordinator):
        await client.aclose()


async def test_a_step_batch_is_assembled_from_its_recorded_groups(harness: LedgerHarness) -> None:
    worker, validator = await harness.worker(), await harness.validator()
    ids = [await judged(harness, worker, validator, reward=0.2) for _ in range(2)]
    steps = harness.ledger.train_steps
    record = steps.record_batch(1, groups_per_step=2, min_version=0)
    assert record is not None
    figures, none = steps.batch(record, BatchRules(), task_prompt, with_samples=False)
    assert none is None and figures["num_samples"] == 8.0 and "sampled_fraction" not in figures
    figures, samples = steps.batch(record, BatchRules(), task_prompt, with_samples=True)
    assert samples is not None and record.submission_ids == ids
    assert len(samples) == 8  # one sample per rollout: 2 groups of 2 prompts x 2 samples
    assert figures["reward_mean"] == pytest.approx(0.35) and 0.0 <= figures["sampled_fraction"] <= 1.0


async def test_reset_drops_a_ledger_that_has_trained(harness: LedgerHarness) -> None:
    """Tables that reference others (leases, submissions, a step's groups, votes) go before the ones they
    reference: SQLite enforces its foreign keys while a table is dropped, and refused to drop a trained ledger."""
    from coordinator.ledger.ownership import drop_ledger, ledger_tables

    worker, validator = await harness.worker(), await harness.validator()
    await judged(harness, worker, validator)
    await judged(harness, worker, validator)
    assert harness.ledger.train_steps.record_batch(1, groups_per_step=2, min_version=0) is not None
    await worker.aclose()
    await validator.aclose()
    assert {"tasks", "leases", "submissions", "step_submissions", "train_steps"} <= set(ledger_tables(harness.database))
    drop_ledger(harness.database)
    assert ledger_tables(harness.database) == []
