"""`prime-validator run` progress: reason kinds, rates, the JSON figures and the live line people see."""

from __future__ import annotations

import asyncio

from rich.console import Console

from protocol.schemas import Verdict
from validator.progress import ValidatorState, reason_kind, show_status


def test_progress_counts_reason_kinds_and_rates() -> None:
    assert reason_kind("rollout p0/s1: toploc: 40 exponent mismatches") == "toploc"
    assert reason_kind("signature: bad signature") == "signature"
    state = ValidatorState()
    state.record(Verdict(submission_id="a", accepted=True), 8, 2)
    reasons = ["rollout p0/s0: sampling: off", "rollout p0/s1: sampling: off", "rollout p1/s0: toploc: x"]
    state.record(Verdict(submission_id="b", accepted=False, reasons=reasons), 8, 2)
    state.audit_s = 2.0
    figures = state.figures()
    assert (figures["num_accepted"], figures["num_rejected"], figures["samples_per_s"]) == (1, 1, 2.0)
    assert figures["submissions_per_s"] == 1.0
    assert figures["top_reasons"] == {"sampling": 1, "toploc": 1}
    assert "1 accepted, 1 rejected" in state.summary()


def test_live_line_shows_the_figures() -> None:
    state = ValidatorState(policy_version=3)
    state.record(Verdict(submission_id="a", accepted=False, reasons=["rollout p0/s0: toploc: 9 mismatches"]), 8, 2)
    state.audit_s = 0.5
    console = Console(record=True, width=160, force_terminal=False)

    async def show_once() -> None:
        stop = asyncio.Event()
        stop.set()
        await show_status(state, stop, console)

    asyncio.run(show_once())
    text = console.export_text()
    for expected in ("v3", "samples/s", "4.0", "toploc x1", "2/8"):
        assert expected in text, text
