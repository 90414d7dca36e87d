"""The small WAN lab: the prime network in network namespaces, one worker and the validator behind a NAT, a churn.

Real CLIs in real namespaces on rate-limited links (tests/support/netlab.py): a coordinator and a
relay on fast links, a public worker on a 100 Mbit/s link, and behind a NAT a worker and the
validator, which nothing can connect to. After a few steps the public worker is killed with SIGKILL
and restarted; the ledger must then show accepted work from both workers (the NAT'd one taking
part through outbound connections only), none of it lost or accepted twice, and the lab must leave
no namespace behind. With CI=true a host that cannot make namespaces fails the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.netlab import Lab, lab_namespaces, namespaces_unavailable
from tests.support.requirements import missing
from tests.support.wan_network import WanNetwork, WanSpec, build_wan, ledger_audit

SPEC = WanSpec(num_relays=1, public_worker_mbit=[100.0], nat_worker_mbit=[100.0], validator_mbit=200.0)


@pytest.fixture
def can_make_namespaces() -> None:
    reason = namespaces_unavailable()
    if reason is not None:
        missing(f"CI=true but the WAN lab cannot run: {reason}", reason)


def test_small_lab_keeps_every_accepted_submission_through_a_worker_crash(
    tmp_path: Path, can_make_namespaces: None
) -> None:
    with Lab(tmp_path) as lab:
        topology = build_wan(lab, SPEC)
        assert [node.nat for node in topology.workers] == [False, True] and topology.validator.nat
        net = WanNetwork(lab, topology, tmp_path, {"orchestrator": {"groups_per_step": 2}})
        net.start_all()
        try:
            net.wait_for_step(2, timeout_s=240)
            net.kill_worker(0)
            time.sleep(2)
            net.start_worker(0)
            crashed_at = net.latest_step()
            net.wait_for_step(crashed_at + 2, timeout_s=180)
            net.check_alive()
        finally:
            net.stop()
        audit = ledger_audit(tmp_path / "run" / "ledger.db")
        ids = net.node_ids()
        prefix = lab.prefix
    assert set(ids) == {"worker-0", "worker-1"}
    for name, node_id in ids.items():
        assert audit["accepted_by_node"].get(node_id, 0) > 0, f"no accepted work from {name}: {audit}"
    assert audit["accepted_lost"] == 0, audit
    assert audit["accepted_reused"] == 0, audit
    assert lab_namespaces(prefix) == []


def test_a_nat_refuses_inbound_connections_and_lets_outbound_ones_through(
    tmp_path: Path, can_make_namespaces: None
) -> None:
    with Lab(tmp_path) as lab:
        topology = build_wan(lab, SPEC)
        public, behind = topology.workers
        probe = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"
        for server in (public, behind):
            listener = lab.start(server.ns, f"listen-{server.name}", [sys.executable, "-m", "http.server", "9000"])
            deadline = time.monotonic() + 20
            while server.ns.exec("curl", "-sf", "http://127.0.0.1:9000/", check=False).returncode != 0:
                assert time.monotonic() < deadline and listener.poll() is None
                time.sleep(0.1)
        outbound = behind.ns.exec(sys.executable, "-c", probe, public.address, "9000", check=False)
        inbound = public.ns.exec(sys.executable, "-c", probe, behind.address, "9000", check=False)
        prefix = lab.prefix
    assert outbound.returncode == 0, outbound.stderr
    assert inbound.returncode != 0
    assert lab_namespaces(prefix) == []


LAB_UNTIL_SIGNALLED = r"""
import sys, time
from pathlib import Path
from tests.support.netlab import Lab

with Lab(Path(sys.argv[1])) as lab:
    router = lab.router("router")
    leaf = lab.namespace("leaf")
    lab.link(leaf, router, rate_mbit=100.0)
    sleeper = lab.start(leaf, "sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
    print(lab.prefix, sleeper.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_lab_removes_its_namespaces_and_processes(
    tmp_path: Path, can_make_namespaces: None, signum: int
) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAB_UNTIL_SIGNALLED, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stdout is not None
        prefix, pid = proc.stdout.readline().split()
        assert len(lab_namespaces(prefix)) == 2
        os.kill(proc.pid, signum)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lab_namespaces(prefix) == []
    assert not Path(f"/proc/{pid}").exists(), "the process started inside the lab outlived it"
