"""Progress deadlines and prompt answers: a live but slow request is cut off; slow sources are not waited for."""

from __future__ import annotations

import asyncio
import time

import pytest

from shardcast.client.progress import ProgressDeadline, TooSlowError, prompt_answers, with_progress_deadline

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the engine is asyncio code


async def _trickle(counter: list[int], num_bytes: int, delay_s: float) -> str:
    for _ in range(num_bytes):
        await asyncio.sleep(delay_s)
        counter[0] += 1
    return "done"


async def test_a_trickle_below_the_floor_is_cut_off_after_one_window() -> None:
    counter = [0]
    started = time.monotonic()
    with pytest.raises(TooSlowError, match="below the 1000 B/s floor"):
        await with_progress_deadline(
            _trickle(counter, 1000, 0.05), lambda: counter[0], ProgressDeadline(5.0, 1000, 0.4), "trickle"
        )
    assert time.monotonic() - started < 3


async def test_no_first_byte_within_the_response_timeout_is_cut_off() -> None:
    with pytest.raises(TooSlowError, match="no data within"):
        await with_progress_deadline(asyncio.sleep(30), lambda: 0, ProgressDeadline(0.3, 1000, 1.0), "silent")


async def test_a_fast_enough_request_finishes() -> None:
    counter = [0]
    result = await with_progress_deadline(
        _trickle(counter, 20, 0.01), lambda: counter[0], ProgressDeadline(1.0, 10, 0.2), "fine"
    )
    assert result == "done"


async def test_prompt_answers_do_not_wait_for_the_slowest() -> None:
    async def answer(value: int, delay_s: float) -> int:
        await asyncio.sleep(delay_s)
        return value

    started = time.monotonic()
    answers = await prompt_answers([answer(1, 0.01), answer(2, 0.05), answer(3, 30)], timeout_s=10, grace_s=0.3)
    assert answers == [1, 2, None] and time.monotonic() - started < 2
