"""Integration fixtures: a real coordinator network on 127.0.0.1 (see tests/integration/network.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.network import SPEC, Network, running_network
from toploc.tiny_model import save_tiny_qwen2


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    """A coordinator on the 'count' task with two tiny policy checkpoints (v0 published, v1 to publish)."""
    checkpoints = [save_tiny_qwen2(tmp_path / f"policy-{v}", seed=v, spec=SPEC) for v in range(2)]
    with running_network(tmp_path, checkpoints) as net:
        yield net
