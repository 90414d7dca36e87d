"""Integration fixtures: a real coordinator network on 127.0.0.1 (see tests/support/network.py), and
SHARDCAST relay processes with a coordinator identity to sign their versions (tests/support/shardcast_nodes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.identity import NodeIdentity
from tests.support.network import Network, running_network
from tests.support.shardcast_nodes import Nodes


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    """A coordinator on the 'count' task with two tiny policy checkpoints (v0 published, v1 to publish)."""
    with running_network(tmp_path) as net:
        yield net


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """`prime-relay` processes (origins, relays, fetches) under tmp_path, each stopped by PID afterwards."""
    started = Nodes(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def coordinator() -> NodeIdentity:
    """A fresh coordinator identity: what signs the versions the relays serve."""
    return NodeIdentity.generate()
