"""`GET /v1/dashboard` and the /dashboard page, in-process: what a run's ledger shows, and nothing secret."""

from __future__ import annotations

import httpx
import pytest

from coordinator.ledger.batches import batch_summary
from coordinator.serving.dashboard.history import RunHistory, rate_series
from protocol.schemas import Dashboard, ErrorBody, Event, HeartbeatRequest, LeaseRequest, RunStatus, Verdict
from tests.support.ledger_helpers import signed_manifest, submission_for
from tests.unit.coordinator.conftest import LedgerHarness, MakeHarness
from tests.unit.coordinator.ledger.test_train_steps import judged

pytestmark = pytest.mark.anyio


def public_client(harness: LedgerHarness) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://ledger")


async def test_dashboard_shows_workers_verdicts_rewards_and_versions(harness: LedgerHarness) -> None:
    worker, other, validator = await harness.worker(), await harness.worker(), await harness.validator()
    await worker.heartbeat(HeartbeatRequest(policy_versions_held=[0, 1], engine="hf", tokens_per_s=12.5))
    await other.heartbeat(HeartbeatRequest(policy_versions_held=[0], engine="vllm", tokens_per_s=30.0))
    coordinator = harness.client(harness.coordinator)
    await coordinator.publish(signed_manifest(harness.coordinator, 0))
    expected_rewards = {}
    submitted_tokens = 0
    for client, rewards, accepted in ((worker, [1.0, 0.5, 0.0, 0.5], True), (other, [0.25] * 4, False)):
        (task,) = (await client.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))).tasks
        submission = submission_for(task, engine="vllm" if client is other else "hf")
        submitted_tokens += sum(len(rollout.completion_ids) for rollout in submission.rollouts)
        answer = await client.submit(submission)
        reasons = [] if accepted else ["token 3 differs from the replayed draw"]
        verdict = Verdict(submission_id=answer.submission_id, accepted=accepted, reasons=reasons, rewards=rewards)
        await validator.pending(limit=256)
        await validator.post_verdict(verdict)
        if accepted:  # a rejection carries no rewards: they are never trained on
            expected_rewards[answer.submission_id] = sum(rewards) / len(rewards)
    await coordinator.publish(signed_manifest(harness.coordinator, 1))
    harness.clock.advance(10)

    async with public_client(harness) as http:
        response = await http.get("/v1/dashboard")
    assert response.status_code == 200, response.text
    dashboard = Dashboard.model_validate_json(response.content)
    assert dashboard.status.num_submissions_accepted == 1 and dashboard.status.num_submissions_rejected == 1
    by_id = {node.node_id: node for node in dashboard.nodes}
    shown = by_id[worker.identity.node_id]
    assert (shown.role, shown.engine, shown.policy_version, shown.versions_held) == ("worker", "hf", 1, [0, 1])
    assert (shown.tokens_per_s, shown.num_accepted, shown.num_rejected, shown.live) == (12.5, 1, 0, True)
    assert by_id[other.identity.node_id].num_rejected == 1
    assert by_id[validator.identity.node_id].role == "validator"

    newest, oldest = dashboard.verdicts
    assert (newest.accepted, newest.reasons, newest.engine, newest.policy_version) == (
        False,
        ["token 3 differs from the replayed draw"],
        "vllm",
        0,
    )
    assert (oldest.worker_id, oldest.validator_id) == (worker.identity.node_id, validator.identity.node_id)
    assert {v.submission_id: v.mean_reward for v in dashboard.rewards} == expected_rewards
    assert [v.event_id for v in dashboard.rewards] == sorted(v.event_id for v in dashboard.rewards)
    # The accepted verdict's 4 rollouts, in the first of two 5 s buckets since the run's first event.
    assert [p.value for p in dashboard.accepted_samples_per_s] == [0.8, 0.0]

    v1, v0 = dashboard.versions
    assert (v1.version, v1.num_live_holders, v1.num_accepted, v1.mean_reward) == (1, 1, 0, None)
    assert (v0.version, v0.num_live_holders, v0.num_accepted, v0.num_rejected, v0.mean_reward) == (0, 2, 1, 1, 0.5)
    # Generation tokens/s from the submit events (accepted or not), bucketed like the samples/s.
    assert [p.value for p in dashboard.tokens_per_s] == [submitted_tokens / 5, 0.0]
    assert sum(n.tokens_per_s for n in dashboard.nodes if n.live) == 42.5  # the live figure: heartbeats

    body = response.text  # public: no IP address, no run secret
    assert "127.0.0.1" not in body and "testclient" not in body
    with harness.database.read() as conn:
        secret = conn.exec_driver_sql("SELECT secret_hex FROM run_state").scalar_one()
    assert secret not in body


async def test_dashboard_reads_only_new_events_on_each_poll(harness: LedgerHarness) -> None:
    worker, validator = await harness.worker(), await harness.validator()
    async with public_client(harness) as http:
        first = Dashboard.model_validate_json((await http.get("/v1/dashboard")).content)
        assert first.rewards == [] and first.verdicts == []
        submitted_tokens = 0
        for reward in (0.0, 1.0):
            (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
            submission = submission_for(task)
            submitted_tokens += sum(len(rollout.completion_ids) for rollout in submission.rollouts)
            answer = await worker.submit(submission)
            verdict = Verdict(submission_id=answer.submission_id, accepted=True, rewards=[reward] * 4)
            await validator.pending(limit=256)
            await validator.post_verdict(verdict)
            harness.clock.advance(3)
            later = Dashboard.model_validate_json((await http.get("/v1/dashboard")).content)
    assert [v.mean_reward for v in later.rewards] == [0.0, 1.0]  # each verdict once, in order
    # Both submissions' tokens, in the run's time buckets however often the page is read.
    assert sum(p.value for p in later.tokens_per_s) * 5 == pytest.approx(submitted_tokens)


async def test_dashboard_page_and_assets(harness: LedgerHarness) -> None:
    async with public_client(harness) as http:
        page = await http.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert 'src="/dashboard/dashboard.js"' in page.text and "reward-chart" in page.text
        assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN
        script = await http.get("/dashboard/dashboard.js")
        assert script.status_code == 200 and "/v1/dashboard" in script.text
        assert (await http.get("/dashboard/dashboard.css")).headers["content-type"].startswith("text/css")
        for bad in ("/dashboard/..%2Fledger.py", "/dashboard/index.html.bak", "/dashboard/%2e%2e"):
            refused = await http.get(bad)
            assert refused.status_code == 404, bad
            ErrorBody.model_validate_json(refused.content)
        landing = await http.get("/")
        assert landing.status_code == 307 and landing.headers["location"] == "/dashboard"
        schema = (await http.get("/openapi.json")).json()
    assert "/v1/dashboard" in schema["paths"] and "/dashboard" not in schema["paths"]


def event(event_id: int, kind: str, subject: str | None, **data: object) -> Event:
    return Event(event_id=event_id, at=100.0 + event_id, kind=kind, node_id=None, subject=subject, data=data)


def test_history_reads_odd_event_data_as_absent() -> None:
    history = RunHistory()
    history.fold(
        [
            event(1, "publish", "x", total_size_bytes=5),
            event(2, "submit", "s1", policy_version="0", engine="evil"),
            event(3, "verdict", "s1", accepted="yes", reasons="not a list", rewards=[1, "2", True, float("nan")]),
            event(4, "verdict", "s-unknown", accepted=True, worker_id=7, rewards=None),
        ]
    )
    first, second = history.recent
    assert (first.policy_version, first.engine, first.accepted, first.reasons) == (None, None, False, [])
    assert (first.num_rollouts, first.mean_reward) == (1, 1.0)
    assert (second.worker_id, second.num_rollouts, second.mean_reward) == ("", 0, None)
    assert history.versions == {} and list(history.rewards) == [first]
    history.fold([event(2, "submit", "s2", policy_version=0)])  # already folded: ignored
    assert history.after == 4


def test_history_tells_full_versions_from_patches() -> None:
    history = RunHistory()
    history.fold(
        [
            event(
                1, "publish", "3", total_size_bytes=900, published_as="full", base_version=None, checkpoint_bytes=900
            ),
            event(2, "publish", "4", total_size_bytes=40, published_as="patch", base_version=3, checkpoint_bytes=900),
            event(3, "publish", "5", total_size_bytes=7, published_as="evil", base_version="3", checkpoint_bytes=-1),
        ]
    )
    full, patch, odd = (history.versions[v] for v in (3, 4, 5))
    assert (full.kind, full.base_version, full.checkpoint_bytes) == ("full", None, 900)
    assert (patch.kind, patch.base_version, patch.total_size_bytes, patch.checkpoint_bytes) == ("patch", 3, 40, 900)
    assert (odd.kind, odd.base_version, odd.checkpoint_bytes) == (None, None, None)


def test_rate_series_buckets_counts_per_second() -> None:
    assert rate_series([(1.0, 3)], start=50.0, now=50.0) == []
    points = rate_series([(0.0, 4), (3.0, 6), (12.0, 10)], start=0.0, now=20.0, num_buckets=4, min_bucket_s=5.0)
    assert [(p.at, p.value) for p in points] == [(5.0, 2.0), (10.0, 0.0), (15.0, 2.0), (20.0, 0.0)]
    long_run = rate_series([(0.0, 1), (1000.0, 1)], start=0.0, now=1000.0, num_buckets=10, min_bucket_s=5.0)
    assert len(long_run) == 10 and long_run[-1].value == 1 / 100
    late = rate_series([(30.0, 1)], start=0.0, now=20.0, num_buckets=4, min_bucket_s=5.0)
    assert [p.value for p in late] == [0.0] * 4  # a record after now is ignored


def test_throughput_starts_at_the_runs_first_event() -> None:
    history = RunHistory()
    assert history.accepted_samples_per_s(now=200.0) == []
    history.fold(
        [
            event(0, "publish", "0"),
            event(1, "submit", "s1"),
            event(2, "verdict", "s1", accepted=True, rewards=[1.0] * 5),
        ]
    )
    points = history.accepted_samples_per_s(now=130.0)  # events at 100, 101, 102: six 5 s buckets
    assert [p.at for p in points] == [105.0, 110.0, 115.0, 120.0, 125.0, 130.0]
    assert [p.value for p in points] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


async def test_dashboard_shows_training_steps_and_their_batch_rewards(harness: LedgerHarness) -> None:
    async with public_client(harness) as http:
        assert Dashboard.model_validate_json((await http.get("/v1/dashboard")).content).training is None
        worker, validator = await harness.worker(), await harness.validator()
        steps = harness.ledger.train_steps
        expected = {}
        for step, reward in ((1, 0.25), (2, 0.5)):  # as the orchestrator does: record, train, publish
            await judged(harness, worker, validator, reward=reward)
            assert steps.record_batch(step, groups_per_step=1, min_version=0) is not None
            summary = batch_summary(steps.groups(step), trained_version=step - 1)
            done = {"loss": 0.1, "reward_mean": summary["reward_mean"]}
            steps.mark_trained(step, {**done, **{f"batch_{k}": v for k, v in summary.items()}, "wait_s": 1.0})
            expected[step] = summary["reward_mean"]
            if step == 1:
                steps.mark_published(step)
        training = Dashboard.model_validate_json((await http.get("/v1/dashboard")).content).training
    assert training is not None and (training.current_step, training.num_steps_done) == (2, 1)
    assert {s.step: s.reward_mean for s in training.steps} == expected
    assert expected == {1: pytest.approx(0.4), 2: pytest.approx(0.65)}  # 4 rollouts a group, rewarded r + 0.1 i
    await worker.aclose()
    await validator.aclose()


def test_training_history_reads_odd_train_step_events_as_absent() -> None:
    history = RunHistory()
    history.fold(
        [
            event(1, "train_step", "x", state="trained", metrics={"batch_reward_mean": 1.0}),
            event(2, "train_step", "0", state="trained", metrics={"batch_reward_mean": 1.0}),
            event(3, "train_step", "1", state="trained", metrics={"batch_reward_mean": "1", "reward_mean": 0.5}),
            event(4, "train_step", "2", state="trained", metrics=[1.0]),
            event(5, "train_step", "3", state="trained", metrics={"batch_reward_mean": float("inf")}),
            event(6, "train_step", "1", state="trained", metrics={"batch_reward_mean": 0.9}),
        ]
    )
    training = history.training.summary()
    assert training is not None and [(s.step, s.reward_mean) for s in training.steps] == [(1, 0.5)]
    assert (training.current_step, training.num_steps_done) == (3, 0)


async def test_rollout_endings_and_evals_show_on_the_dashboard_metrics_and_status(harness: LedgerHarness) -> None:
    async with public_client(harness) as http:
        worker, validator = await harness.worker(), await harness.validator()
        steps = harness.ledger.train_steps
        figures = {"eval_accuracy": 0.25, "eval_reward_mean": 0.5, "eval_stop_fraction": 0.75}
        steps.record_eval(0, {**figures, "eval_completion_tokens_mean": 4.0})  # the start policy: no step row
        assert harness.ledger.newest_eval() is None
        for step in (1, 2):
            await judged(harness, worker, validator)
            assert steps.record_batch(step, groups_per_step=1, min_version=0) is not None
            summary = batch_summary(steps.groups(step), trained_version=step - 1)
            trainer = {"loss": 0.1, "entropy": 1.5 - step / 10, "mismatch_kl": 0.002, "grad_norm": 0.75}
            steps.mark_trained(step, {**trainer, **{f"batch_{k}": v for k, v in summary.items()}})
            steps.mark_published(step)
        steps.record_eval(1, {**figures, "eval_accuracy": 0.5, "eval_completion_tokens_mean": 6.0})
        training = Dashboard.model_validate_json((await http.get("/v1/dashboard")).content).training
        metrics = (await http.get("/metrics")).text
    assert training is not None
    # submission_for's rollouts: 3 tokens each, all ended with EOS
    assert [(s.step, s.completion_tokens_mean, s.stop_fraction, s.truncated_fraction) for s in training.steps] == [
        (1, 3.0, 1.0, 0.0),
        (2, 3.0, 1.0, 0.0),
    ]
    assert [(s.loss, s.entropy, s.mismatch_kl, s.grad_norm) for s in training.steps] == [
        (0.1, 1.4, 0.002, 0.75),
        (0.1, 1.3, 0.002, 0.75),
    ]
    assert [(e.step, e.accuracy, e.reward_mean, e.completion_tokens_mean) for e in training.evals] == [
        (0, 0.25, 0.5, 4.0),
        (1, 0.5, 0.5, 6.0),
    ]
    newest = harness.ledger.newest_eval()
    assert newest is not None and newest[0] == 1 and newest[1]["eval_accuracy"] == 0.5 and newest[1]["loss"] == 0.1
    status = harness.ledger.status()
    assert (status.step_stop_fraction, status.step_truncated_fraction, status.eval_step) == (1.0, 0.0, 1)
    for line in (
        "prime_train_step_completion_tokens 3.0",
        "prime_train_step_stop_fraction 1.0",
        "prime_train_step_truncated_fraction 0.0",
        "prime_train_step_loss 0.1",
        "prime_train_step_entropy 1.3",
        "prime_train_step_mismatch_kl 0.002",
        "prime_train_step_grad_norm 0.75",
        "prime_train_eval_step 1.0",
        "prime_train_eval_accuracy 0.5",
        "prime_train_eval_reward 0.5",
        "prime_train_eval_completion_tokens 6.0",
    ):
        assert line in metrics.splitlines()
    await worker.aclose()
    await validator.aclose()


async def test_no_eval_gauge_before_an_eval(harness: LedgerHarness) -> None:
    async with public_client(harness) as http:
        metrics = (await http.get("/metrics")).text
    assert "prime_train_eval_accuracy" not in metrics and "prime_train_step_stop_fraction" not in metrics


async def test_the_dashboards_status_is_the_runs_own(make_harness: MakeHarness) -> None:
    """The page's ETA needs the run's steps in all, which only the config knows: the same status as /v1/status."""
    harness = make_harness(orchestrator__enabled=True, orchestrator__num_steps=12)
    async with public_client(harness) as http:
        dashboard = Dashboard.model_validate_json((await http.get("/v1/dashboard")).content)
        status = RunStatus.model_validate_json((await http.get("/v1/status")).content)
    assert dashboard.status.num_train_steps == status.num_train_steps == 12
    assert dashboard.status.run_ended == status.run_ended


async def test_dashboard_shows_the_audit_policy_its_cheating_bound_and_each_worker_s_credit(
    make_harness: MakeHarness,
) -> None:
    from coordinator.ledger.audit_policy import cheat_bound
    from coordinator.ledger.run_spec import signed_run_spec
    from coordinator.serving.app import create_app
    from environments.prompts import NoPrompts

    harness = make_harness(validation__adaptive__enabled=True, validation__adaptive__floor=0.1)
    spec = signed_run_spec(harness.config, harness.coordinator, NoPrompts())
    app = create_app(harness.config, harness.ledger, harness.replay_cache, run_spec=spec)
    worker, validator = await harness.worker(), await harness.validator()
    (task,) = (await worker.lease(LeaseRequest(max_tasks=1))).tasks
    submission = submission_for(task)
    answer = await worker.submit(submission)
    await validator.pending(limit=256)
    await validator.post_verdict(Verdict(submission_id=answer.submission_id, accepted=True))

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ledger") as http:
        dashboard = Dashboard.model_validate_json((await http.get("/v1/dashboard")).content)
    audit = dashboard.audit
    assert audit is not None and audit.adaptive and audit.lowest_share == 0.1
    samples = harness.config.scheduling.prompts_per_task * harness.config.scheduling.group_size
    assert audit.samples_per_submission == samples and audit.detection_power == 1.0
    assert audit.cheated_fraction_bound == cheat_bound(spec.spec.audit, samples, 1.0).cheated_fraction
    shown = {node.node_id: node for node in dashboard.nodes}[worker.identity.node_id]
    assert shown.credit_samples == len(submission.rollouts) and shown.credit_tokens == sum(
        len(rollout.completion_ids) for rollout in submission.rollouts
    )
    for client in (worker, validator):
        await client.aclose()
