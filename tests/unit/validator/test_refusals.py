"""A validator posts each verdict once when the ledger refuses it (any 4xx): no retry loop, no crash.

Only the ledger call is faked (the audit itself is covered by tests/unit/validator/test_audit.py
and the validator network tests): refusals of every kind are logged and the next verdict is
posted; a ban (403) still stops the validator.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import pytest

from protocol.errors import (
    ConflictError,
    ForbiddenError,
    PayloadTooLargeError,
    PrimeError,
    ProtocolError,
    RequestRefused,
)
from protocol.schemas import PendingSubmission, SamplingParams, Task, Verdict, VerdictResponse
from shardcast.client.cache import WeightsCache
from tests.support.ledger_helpers import submission_for
from validator import run as validator_run
from validator.progress import ValidatorState
from validator.run import LoadedPolicy


def pending_item(number: int) -> PendingSubmission:
    task = Task.model_validate(
        {
            "task_id": f"t{number}",
            "lease_id": f"l-{number}",
            "task_name": "count",
            "prompts": [{"prompt_index": 0, "token_ids": [1, 2]}],
            "group_size": 1,
            "sampling": SamplingParams(temperature=1.0, max_tokens=8).model_dump(),
            "policy_version": 0,
            "sampling_seed": 7,
            "deadline": time.time() + 60,
        }
    )
    return PendingSubmission(
        submission_id=f"s-{number}",
        worker_id="1" * 44,
        task=task,
        submission=submission_for(task),
        submitted_at=time.time(),
        worker_signature_b64="",
    )


class RefusingLedger:
    """post_verdict answers with the given refusals in turn (None: accepted)."""

    def __init__(self, answers: list[PrimeError | None]) -> None:
        self.answers = answers
        self.posted: list[str] = []

    async def post_verdict(self, verdict: Verdict) -> VerdictResponse:
        self.posted.append(verdict.submission_id)
        answer = self.answers[len(self.posted) - 1]
        if answer is not None:
            raise answer
        return VerdictResponse(submission_id=verdict.submission_id, status="accepted", worker_banned=False)


class OneEngine:
    """One engine for every version, over a real (empty) weights cache that the audit pins versions in."""

    def __init__(self, weights_dir: Path) -> None:
        self.weights = WeightsCache([], "coordinator", weights_dir)

    async def get(self, version: int) -> LoadedPolicy:
        return LoadedPolicy(cast(Any, object()), (), cast(Any, None), None)


def run_audit(monkeypatch: pytest.MonkeyPatch, answers: list[PrimeError | None]) -> RefusingLedger:
    def audited(items: list[PendingSubmission], *_args: object) -> list[tuple[Verdict, list[Any]]]:
        return [(Verdict(submission_id=item.submission_id, accepted=True), []) for item in items]

    monkeypatch.setattr(validator_run, "audit_submissions_safely", audited)
    ledger = RefusingLedger(answers)
    items = [pending_item(i) for i in range(len(answers))]
    with tempfile.TemporaryDirectory() as weights_dir:
        engines = OneEngine(Path(weights_dir))
        coroutine = validator_run.audit_pending(ledger, engines, ValidatorState(), items, asyncio.Event())  # type: ignore[arg-type]
        asyncio.run(asyncio.wait_for(coroutine, timeout=30))
    return ledger


def test_every_refusal_is_posted_once_and_the_next_verdict_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    refusals: list[PrimeError | None] = [
        ProtocolError("invalid request: rewards.0: Input should be a finite number"),
        PayloadTooLargeError("request body of 20000000 bytes is over the limit"),
        ConflictError("a vote cannot be changed"),
        RequestRefused("refused"),
        None,
    ]
    ledger = run_audit(monkeypatch, refusals)
    assert ledger.posted == [f"s-{i}" for i in range(len(refusals))]


def test_a_ban_stops_the_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ForbiddenError):
        run_audit(monkeypatch, [ForbiddenError("validator is banned"), None])
