"""Shared fixtures: free ports on 127.0.0.1, the PostgreSQL URL, temporary data dirs."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from runtime.ports import free_port
from tests.support.requirements import missing

__all__ = ["free_port"]


_BUILTIN_DIR = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--build-starts",
        action="store_true",
        help="build the built-in RL start checkpoints the tests use before any test runs (make test does: built "
        "inside a test, beside other tests' running networks, one takes several times as long and slows them too)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """One built-in model cache (``PRIME_BUILTIN_DIR``) for the whole session, made empty at its start: each
    built-in start is built once however many test processes need it (xdist's workers inherit the variable,
    and its lock files let one build while the others wait), and no test reads or writes ~/.prime-network.
    With ``--build-starts`` the controller builds the RL starts the tests train from there (each an SFT run
    of a minute or two on an idle machine) before any worker starts, with every core (after it, one thread per
    process)."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller made the cache
        return
    path = Path(tempfile.mkdtemp(prefix="prime-test-builtin-"))
    os.environ["PRIME_BUILTIN_DIR"] = str(path)
    config.stash[_BUILTIN_DIR] = path
    if config.getoption("build_starts"):
        from trainer.builtin import BUILTIN_PREFIX, CALCULATOR_START, REVERSE_START, SORT_START
        from trainer.resolve import resolve_model_path

        for name in (REVERSE_START, SORT_START, CALCULATOR_START):
            started = time.monotonic()
            resolve_model_path(BUILTIN_PREFIX + name)
            print(f"built {BUILTIN_PREFIX}{name} in {time.monotonic() - started:.0f} s", flush=True)
    # From here on (the workers and every process a test starts inherit it) one OpenMP thread per process: the tests
    # run many torch processes at once on few cores, and each one's pool of a thread per core spins against the
    # others. Four network tests took 19% less CPU and 16% less time so (2 cores). An explicit setting wins.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_BUILTIN_DIR, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


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
