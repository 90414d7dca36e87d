"""Checks of generated documentation pages: the committed page must be what its generator makes now."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

MAX_DIFF_LINES = 60


def assert_page_is_fresh(page: Path, fresh: str, command: str, make_target: str) -> None:
    """Fail, with the first lines of the difference and the command that regenerates it, when ``page`` differs from
    ``fresh``."""
    committed = page.read_text()
    if fresh == committed:
        return
    diff = difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True), "committed", "generated")
    shown = "".join(list(diff)[:MAX_DIFF_LINES])
    pytest.fail(f"docs/{page.name} is stale: run `{command}` (or make {make_target})\n{shown}")
