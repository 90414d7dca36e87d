"""Wait for a condition by polling it, up to a deadline: how the benches wait for their processes to be ready."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.02) -> None:
    """Return once ``predicate()`` holds (asked every ``interval_s``); after ``timeout_s``, TimeoutError on ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
