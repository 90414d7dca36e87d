"""The ledger's side of the training-safety contract: groups without signal set aside, refused steps audited again
and rebuilt or skipped, rollbacks asked for and recorded, and what a step may learn from after one."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from coordinator.ledger.batches import BatchRules, task_prompt
from coordinator.ledger.storage.tables import accepted_groups, no_signal_groups, submissions, tasks
from coordinator.ledger.train_steps import RollbackRequest
from protocol.errors import ConfigError
from protocol.schemas import LeaseRequest, Verdict
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness
from tests.unit.coordinator.ledger.test_train_steps import judged

pytestmark = pytest.mark.anyio


async def test_groups_without_signal_are_set_aside_for_the_step_and_never_trained(harness: LedgerHarness) -> None:
    worker, validator = await harness.worker(), await harness.validator()
    flat = [await judged(harness, worker, validator, spread=False) for _ in range(2)]
    steps = harness.ledger.train_steps
    assert steps.record_batch(1, groups_per_step=2, min_version=0, no_signal_scan=3) is None
    # set aside while the step waits: out of the pool at once, so generation goes on
    with harness.database.read() as conn:
        assert sorted(conn.execute(select(no_signal_groups.c.submission_id)).scalars()) == sorted(flat)
    signal = [await judged(harness, worker, validator) for _ in range(2)]
    record = steps.record_batch(1, groups_per_step=2, min_version=0, no_signal_scan=3)
    assert record is not None and record.submission_ids == signal
    figures, samples = steps.batch(record, BatchRules(no_signal_filter=True), task_prompt, with_samples=True)
    assert samples is not None and len(samples) == 8 and figures["zero_signal_fraction"] == 0.5
    assert figures["num_set_aside"] == 2
    stats = {node.node_id: node for node in harness.ledger.stats(100).nodes}
    assert stats[worker.identity.node_id].num_accepted == 4  # credited all the same
    await worker.aclose()
    await validator.aclose()


async def test_the_filter_is_bounded_so_easy_prompts_cannot_stall_a_step(harness: LedgerHarness) -> None:
    worker, validator = await harness.worker(), await harness.validator()
    flat = [await judged(harness, worker, validator, spread=False) for _ in range(2)]
    record = harness.ledger.train_steps.record_batch(1, groups_per_step=1, min_version=0, no_signal_scan=2)
    assert record is not None and record.submission_ids == [flat[1]]  # one set aside, then whatever comes
    figures, samples = harness.ledger.train_steps.batch(
        record, BatchRules(no_signal_filter=True), task_prompt, with_samples=True
    )
    assert samples == [] and figures["zero_signal_fraction"] == 1.0
    await worker.aclose()
    await validator.aclose()


async def test_a_refused_step_is_audited_again_in_full_and_rebuilt_without_what_was_caught(
    harness: LedgerHarness,
) -> None:
    worker, validator = await harness.worker(), await harness.validator()
    steps = harness.ledger.train_steps
    good, bad = [await judged(harness, worker, validator) for _ in range(2)]
    record = steps.record_batch(1, groups_per_step=2, min_version=0)
    assert record is not None and record.attempt == 1
    assert steps.record_trip(1, 1, ["gradient norm 1e4 above the ceiling 100"])
    assert not steps.record_trip(1, 1, ["gradient norm 1e4 above the ceiling 100"])  # a restart: the same refusal
    assert sorted(steps.request_reaudit([good, bad])) == sorted([good, bad])
    again = {item.submission_id: item for item in (await validator.pending()).submissions if item.reaudit}
    assert set(again) == {good, bad} and all(sorted(i.audit_sample_indices) == [0, 1, 2, 3] for i in again.values())
    await validator.post_verdict(Verdict(submission_id=good, accepted=True, rewards=[0.0, 0.1, 0.2, 0.3]))
    await validator.post_verdict(Verdict(submission_id=bad, accepted=False, reasons=["toploc: forged"]))
    assert steps.reaudit_states([good, bad]) == {good: "passed", bad: "failed"}
    # rebuilt: the caught one voided and out of the step; the step waits for a replacement
    assert steps.rebuild_batch(1, [bad], groups_per_step=2, min_version=0, no_signal_scan=None) is None
    with harness.database.read() as conn:
        status = conn.execute(select(submissions.c.status).where(submissions.c.submission_id == bad)).scalar_one()
        in_pool = conn.execute(select(accepted_groups.c.submission_id)).scalars().all()
        reopened = conn.execute(select(tasks.c.state)).scalars().all()
    assert status == "rejected" and bad not in in_pool and "open" in reopened
    replacement = await judged(harness, worker, validator)
    rebuilt = steps.rebuild_batch(1, [bad], groups_per_step=2, min_version=0, no_signal_scan=None)
    assert rebuilt is not None and rebuilt.attempt == 2 and rebuilt.submission_ids == [good, replacement]
    assert rebuilt.trips == [
        {"attempt": 1, "reasons": ["gradient norm 1e4 above the ceiling 100"], "at": rebuilt.trips[0]["at"]}
    ]
    skipped = steps.skip(1)
    assert (skipped.kind, skipped.attempt) == ("skip", 3) and steps.skip(1).attempt == 3
    kinds = [e.kind for e in harness.ledger.events(0, 1000).events]
    assert "breaker_trip" in kinds and "reaudit" in kinds
    await worker.aclose()
    await validator.aclose()


async def test_a_rollback_is_asked_for_recorded_once_and_fences_off_what_it_undid(make_harness: MakeHarness) -> None:
    harness = make_harness(scheduling__async_level=2)
    worker, validator = await harness.worker(), await harness.validator()
    coordinator = harness.client(harness.coordinator)
    steps = harness.ledger.train_steps
    for step in (1, 2, 3):
        await judged(harness, worker, validator)
        assert steps.record_batch(step, groups_per_step=1, min_version=0) is not None
        steps.mark_trained(step, {"loss": 0.1})
        await coordinator.publish(signed_manifest(harness.coordinator, step))
        steps.mark_published(step)
    with pytest.raises(ConfigError, match="published v0 to v3"):
        steps.request_rollback(RollbackRequest(to_version=7, reason="by hand"))
    steps.request_rollback(RollbackRequest(to_version=1, reason="by hand", lr_scale=0.5, source_dir="/kept/v1"))
    request = steps.rollback_request()
    assert request is not None and (request.to_version, request.lr_scale, request.source_dir) == (1, 0.5, "/kept/v1")
    made_by_v3 = await judged(harness, worker, validator)  # leased at v3, which the rollback undoes
    restore = steps.record_restore(4, request)
    assert (restore.kind, restore.restore_version, restore.metrics["rollback"]["lr_scale"]) == ("restore", 1, 0.5)
    assert steps.record_restore(4, request) == restore and steps.rollback_request() is None
    assert [(s.step, s.rolled_back) for s in steps.steps()] == [(1, False), (2, True), (3, True), (4, False)]
    assert steps.version_floor() == 4
    with pytest.raises(ConfigError, match="a rollback undid it"):
        steps.request_rollback(RollbackRequest(to_version=2, reason="by hand"))
    # the next step learns from v4 on: the v3 submission is credited, never trained
    assert steps.record_batch(5, groups_per_step=1, min_version=4) is None
    assert made_by_v3 not in [sid for s in steps.steps() for sid in s.submission_ids]
    for client in (worker, validator, coordinator):
        await client.aclose()


def test_a_group_without_signal_inside_a_submission_is_left_out_of_the_samples() -> None:
    from coordinator.ledger.batches import accepted_group, batch_summary, train_samples
    from tests.unit.coordinator.ledger.test_batches import group_columns

    # stored order (1,1), (0,1), (1,0), (0,0): prompt 0's two samples both earn 1.0, prompt 1's differ
    group = accepted_group("s", 3, *group_columns([0.9, 1.0, 0.1, 1.0]))
    kept = train_samples([group], BatchRules(no_signal_filter=True))
    assert [s.prompt_ids for s in kept] == [[20], [20]] and {(s.policy_version, s.group) for s in kept} == {(3, 0)}
    assert len(train_samples([group])) == 4
    assert batch_summary([group], trained_version=3)["zero_signal_fraction"] == 0.5


async def test_the_canary_keeps_the_best_policy_and_asks_for_a_rollback_on_a_fall(
    harness: LedgerHarness, tmp_path: pytest.TempPathFactory
) -> None:
    from pathlib import Path

    from coordinator.loop.canary import Canary, fall_margin

    assert fall_margin(0.5, 128, 0.5, 128, 3.0) == pytest.approx(3 * (0.25 * 2 / 128) ** 0.5)
    assert fall_margin(1.0, 64, 1.0, 64, 3.0) == 0.0
    config = harness.config.model_copy(update={"data_dir": Path(str(tmp_path))})
    canary = Canary(config, harness.ledger.train_steps)

    def policy(version: int) -> Path:
        folder = Path(str(tmp_path)) / "evals" / f"v{version}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_text(f"weights of v{version}")
        return folder

    def figures(accuracy: float) -> dict[str, float]:
        return {"eval_accuracy": accuracy, "eval_num_examples": 128.0}

    assert canary.on_eval(0, figures(0.40), policy(0)) is None
    assert canary.on_eval(5, figures(0.55), policy(5)) is None and canary.best is not None and canary.best.version == 5
    assert canary.on_eval(10, figures(0.45), policy(10)) is None  # a wobble: within 3 standard errors (0.19)
    request = canary.on_eval(15, figures(0.30), policy(15))
    assert request is not None and request.to_version == 5 and "fell below v5's" in request.reason
    assert (Path(request.source_dir) / "model.safetensors").read_text() == "weights of v5"
    assert Canary(config, harness.ledger.train_steps).best == canary.best  # kept across a restart


async def test_a_prompt_without_signal_several_times_in_a_row_rests(make_harness: MakeHarness) -> None:
    from collections.abc import Sequence

    from environments.prompts import SourcePrompt

    class TwoPrompts:
        """A finite dataset read again and again: even groups ask prompt A, odd ones prompt B."""

        name, max_turns, shows_images = "two", 1, False

        def prompt_group(self, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
            return [SourcePrompt((1, 2 + group_index % 2, k + 5), f"{group_index % 2}/{k}") for k in range(num_prompts)]

    harness = make_harness(orchestrator__rest_after=2, orchestrator__rest_groups=4)
    harness.ledger.leases.prompts = TwoPrompts()
    worker, validator = await harness.worker(), await harness.validator()
    steps = harness.ledger.train_steps

    async def lease_and_judge(spread: bool) -> str:
        (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
        answer = await worker.submit(submission_for(task))
        rewards = [0.1 * i if spread else 1.0 for i in range(len(task.prompts) * task.group_size)]
        await validator.pending(limit=256)
        await validator.post_verdict(Verdict(submission_id=answer.submission_id, accepted=True, rewards=rewards))
        return task.task_id

    for step, spread in enumerate((False, True, False, True), start=1):  # A flat, B spread, A flat (2nd), B spread
        await lease_and_judge(spread)
        assert steps.record_batch(step, groups_per_step=1, min_version=0) is not None
    # A rests for 4 tasks (t4 .. t7): the next tasks are B's groups only
    assert [await lease_and_judge(True) for _ in range(2)] == ["t5", "t7"]
    assert await lease_and_judge(True) == "t8"  # A is back
    await worker.aclose()
    await validator.aclose()
