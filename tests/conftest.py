"""Shared fixtures: free ports on 127.0.0.1, the PostgreSQL URL, temporary data dirs."""

from __future__ import annotations

import os

import pytest

from runtime.ports import free_port
from tests.support.requirements import missing

__all__ = ["free_port"]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server for ledger tests. In CI (CI=true) it must be reachable: fail, never skip."""
    url = os.environ.get("PRIME_TEST_POSTGRES_URL", "")
    if not url:
        missing(
            "CI=true but PRIME_TEST_POSTGRES_URL is not set; .ci/run sets it",
            "PRIME_TEST_POSTGRES_URL not set (set it to run the PostgreSQL ledger tests)",
        )
    return url
