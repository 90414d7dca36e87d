"""What a test needs from the machine (a service, a tool): skipped where it is missing, failed where CI=true."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(in_ci: str, here: str | None = None) -> NoReturn:
    """Fail with ``in_ci`` under CI=true (CI installs and starts everything its tests need); else skip with
    ``here`` (``in_ci`` when not given)."""
    if os.environ.get("CI"):
        pytest.fail(in_ci)
    pytest.skip(here if here is not None else in_ci)
