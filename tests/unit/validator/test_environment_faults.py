"""Faults that are not the worker's: an environment that cannot score, a policy version nobody holds any more.

A reward function that raises anything, or returns NaN, inf, a string or something that is not
:class:`Scores`, gives an honest group an ``environment_error`` verdict (one line naming the
exception, no rewards, nothing accepted) instead of killing the audit or leaving no verdict; a
group whose proofs fail is still rejected, whatever the environment does. A validator that cannot
fetch one policy version skips its submissions with a warning and audits the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engines.hf import HFEngine
from environments.base import Scores
from protocol.errors import NotFoundError
from protocol.identity import NodeIdentity
from protocol.schemas import PendingSubmission, Task, Verdict
from protocol.signing import sign_document
from tests.support.adversary import flipped_signs, honest_claims, sample_tasks_of, submission_of
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, save_tiny_qwen2
from tests.unit.validator.test_refusals import OneEngine, RefusingLedger, pending_item
from validator import run as validator_run
from validator.audit import audit_submissions_safely
from validator.progress import ValidatorState
from validator.run import LoadedPolicy

EOS = (TINY_EOS_TOKEN_ID,)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> HFEngine:
    return HFEngine(save_tiny_qwen2(tmp_path_factory.mktemp("policy") / "m", seed=3), max_batch_size=8)


def make_task(task_id: str, example_index: int) -> Task:
    return Task.model_validate(
        {
            "task_id": task_id,
            "lease_id": f"l-{task_id}",
            "task_name": "test",
            "prompts": [{"prompt_index": 0, "token_ids": [5, 9, 33, 12], "example_index": example_index}],
            "group_size": 2,
            "sampling": {"temperature": 1.0, "max_tokens": 24},
            "policy_version": 3,
            "sampling_seed": 4242,
            "deadline": time.time() + 60,
        }
    )


def pending(policy: HFEngine, task: Task, cheat: bool = False) -> PendingSubmission:
    tasks = sample_tasks_of(task, EOS)
    claims = flipped_signs(policy, tasks) if cheat else honest_claims(policy, tasks)
    worker = NodeIdentity.generate()
    submission = submission_of(task, claims)
    return PendingSubmission(
        submission_id=f"s-{task.task_id}",
        worker_id=worker.node_id,
        task=task,
        submission=submission,
        submitted_at=time.time(),
        worker_signature_b64=sign_document(worker, submission.model_dump(mode="json")),
    )


def broken_scores(value: object) -> Scores:
    scores = Scores.single("ratio", 0.0)
    object.__setattr__(scores, "rewards", {"ratio": value})  # past Scores' own checks, as a careless scorer may
    return scores


FAULTS: dict[str, tuple[Any, str]] = {
    "zero_division": (lambda: 1 / 0, "ZeroDivisionError: division by zero"),
    "runtime_error": (
        lambda: (_ for _ in ()).throw(RuntimeError("judge\nunreachable")),
        "RuntimeError: judge unreachable",
    ),
    "nan": (lambda: broken_scores(float("nan")), "ValueError: reward 'ratio' is nan, not a finite number"),
    "inf": (lambda: broken_scores(float("-inf")), "ValueError: reward 'ratio' is -inf, not a finite number"),
    "string": (lambda: broken_scores("high"), "ValueError: reward 'ratio' is 'high', not a finite number"),
    "not_scores": (lambda: 0.5, "ValueError: score() returned float, not Scores"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_an_environment_fault_is_an_environment_error_verdict_not_a_crash(policy: HFEngine, fault: str) -> None:
    make_result, summary = FAULTS[fault]

    def reward(example_index: int, _turn_ids: Sequence[Sequence[int]]) -> Scores:
        return Scores.single("ratio", 0.25) if example_index == 0 else make_result()

    good, bad = pending(policy, make_task("good", 0)), pending(policy, make_task("bad", 1))
    results = audit_submissions_safely([good, bad], policy, EOS, reward_fn=reward)
    (scored, _), (unscored, _) = results
    assert scored.accepted and scored.rewards == [0.25, 0.25] and scored.environment_error is None
    assert not unscored.accepted and not unscored.rewards
    assert unscored.environment_error == f"environment: scoring rollout p0/s0 failed: {summary}"
    assert unscored.reasons == [unscored.environment_error]
    assert "\n" not in unscored.environment_error


def test_a_cheated_group_is_rejected_whatever_the_environment_does(policy: HFEngine) -> None:
    def reward(_example_index: int, _turn_ids: Sequence[Sequence[int]]) -> Scores:
        raise ZeroDivisionError("division by zero")

    (verdict, _), *_ = audit_submissions_safely(
        [pending(policy, make_task("x", 1), cheat=True)], policy, EOS, None, reward
    )
    assert not verdict.accepted and verdict.environment_error is None
    assert all(reason.startswith("rollout p") for reason in verdict.reasons)


class GoneVersion(OneEngine):
    """Version 0 can no longer be fetched from anyone; the others can."""

    async def get(self, version: int) -> LoadedPolicy:
        if version == 0:
            raise NotFoundError("no relay holds version 0 (origin: 404)")
        return await super().get(version)


def test_a_version_nobody_holds_is_skipped_and_the_others_audited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def audited(items: list[PendingSubmission], *_args: object) -> list[tuple[Verdict, list[Any]]]:
        return [(Verdict(submission_id=item.submission_id, accepted=True), []) for item in items]

    monkeypatch.setattr(validator_run, "audit_submissions_safely", audited)
    stale = [pending_item(0), pending_item(1)]
    current = pending_item(2)
    current = current.model_copy(update={"task": current.task.model_copy(update={"policy_version": 1})})
    ledger, state = RefusingLedger([None]), ValidatorState()
    coroutine = validator_run.audit_pending(
        ledger,  # type: ignore[arg-type]
        GoneVersion(tmp_path / "weights"),  # type: ignore[arg-type]
        state,
        [*stale, current],
        asyncio.Event(),
    )
    with caplog.at_level(logging.WARNING, logger="validator"):
        asyncio.run(asyncio.wait_for(coroutine, timeout=30))
    assert ledger.posted == ["s-2"]
    assert state.num_unfetchable == 2 and "2 skipped (version gone)" in state.summary()
    assert "cannot audit 2 submission(s) of policy v0: no relay holds version 0" in caplog.text
