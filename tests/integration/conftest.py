"""Integration fixtures: a real coordinator network on 127.0.0.1 (see tests/integration/network.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.network import Network, running_network


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    """A coordinator on the 'count' task with two tiny policy checkpoints (v0 published, v1 to publish)."""
    with running_network(tmp_path) as net:
        yield net
