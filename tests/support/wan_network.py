"""The prime network on an emulated WAN: a coordinator, relays, workers and a validator, each in its namespace.

:func:`build_wan` lays out a :class:`~tests.support.netlab.Lab`: a core router; the coordinator
and the relays on fast links to it; public workers on slower rate-limited links to it; and a NAT
router (on a fast uplink to the core) behind which sit the NAT'd workers and the validator, each on
its own rate-limited link. Nothing outside can open a connection to a NAT'd node. :func:`build_loopback`
puts every node in one namespace on 127.0.0.1: the same workload without the links, for comparison.

:class:`WanNetwork` starts the real CLIs inside those namespaces (``prime-coordinator start``,
``prime-relay serve``, ``prime-worker join``, ``prime-validator run``), so every byte between nodes
(ledger API, SHARDCAST, libp2p gossip) crosses the links, and reads the run's ledger:
:func:`ledger_audit` counts accepted work lost or reused, per worker and behind the NAT.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from tests.support.ledger_helpers import read_ledger
from tests.support.netlab import Lab, Link, Namespace

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
API_PORT = 8000
P2P_PORT = 4001
RELAY_PORT = 8100


@dataclass
class WanSpec:
    """Link rates (Mbit/s) of each node; a worker per entry of ``public_worker_mbit`` and ``nat_worker_mbit``."""

    num_relays: int = 2
    backbone_mbit: float = 1000.0
    """The coordinator's, each relay's and the NAT router's uplink."""
    public_worker_mbit: list[float] = field(default_factory=lambda: [100.0, 200.0])
    nat_worker_mbit: list[float] = field(default_factory=lambda: [100.0, 150.0])
    validator_mbit: float = 200.0
    validator_nat: bool = True


@dataclass
class Node:
    name: str
    ns: Namespace
    address: str
    """The address the node binds and announces (127.0.0.1 on loopback)."""
    link: Link | None = None
    """Its access link (None on loopback)."""
    nat: bool = False
    rate_mbit: float | None = None


@dataclass
class Topology:
    coordinator: Node
    relays: list[Node]
    workers: list[Node]
    validator: Node
    loopback: bool

    @property
    def url(self) -> str:
        return f"http://{self.coordinator.address}:{API_PORT}"

    def relay_url(self, index: int) -> str:
        return f"http://{self.relays[index].address}:{RELAY_PORT + (index if self.loopback else 0)}"


def build_wan(lab: Lab, spec: WanSpec) -> Topology:
    core = lab.router("core")
    nat = lab.router("nat")

    def leaf(name: str, router: Namespace, rate: float | None, is_nat: bool = False) -> Node:
        ns = lab.namespace(name)
        link = lab.link(ns, router, rate)
        lab.default_route(ns, link.b_address)
        return Node(name, ns, link.a_address, link, is_nat, rate)

    uplink = lab.link(nat, core, spec.backbone_mbit)
    lab.default_route(nat, uplink.b_address)
    coordinator = leaf("coordinator", core, spec.backbone_mbit)
    relays = [leaf(f"relay-{i}", core, spec.backbone_mbit) for i in range(spec.num_relays)]
    workers = [leaf(f"worker-{i}", core, rate) for i, rate in enumerate(spec.public_worker_mbit)]
    offset = len(workers)
    workers += [leaf(f"worker-{offset + i}", nat, rate, True) for i, rate in enumerate(spec.nat_worker_mbit)]
    validator = leaf("validator", nat if spec.validator_nat else core, spec.validator_mbit, spec.validator_nat)
    nat_links = [node.link for node in [*workers, validator] if node.nat and node.link is not None]
    lab.nat(nat, uplink, nat_links)
    return Topology(coordinator, relays, workers, validator, loopback=False)


def build_loopback(lab: Lab, spec: WanSpec) -> Topology:
    ns = lab.namespace("loopback")
    num_workers = len(spec.public_worker_mbit) + len(spec.nat_worker_mbit)
    return Topology(
        Node("coordinator", ns, "127.0.0.1"),
        [Node(f"relay-{i}", ns, "127.0.0.1") for i in range(spec.num_relays)],
        [Node(f"worker-{i}", ns, "127.0.0.1") for i in range(num_workers)],
        Node("validator", ns, "127.0.0.1"),
        loopback=True,
    )


def run_config(root: Path, topology: Topology, sections: dict[str, dict[str, Any]]) -> Path:
    """The demo workload (reverse_text, 4 prompts x 8 samples, 32 tokens, async level 1) on the lab's
    addresses; ``sections`` update the config's sections."""
    config: dict[str, Any] = {
        "run_name": "netlab",
        "data_dir": str(root / "run"),
        "environment": {"type": "builtin", "name": "reverse_text"},
        # Bound as on a real machine (docs/operator.md): every interface, and no p2p.public_host, so the
        # coordinator advertises its gossip address as each node reached its API.
        "api": {"host": "0.0.0.0", "port": API_PORT, "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {"async_level": 1, "lease_ttl_s": 60, "prompts_per_task": 4, "group_size": 8, "max_tokens": 32},
        "trust": {"validators_open": True, "ban_after_rejections": 3},
        # The lab's nodes are the operator's own: trusted, as loopback is in configs/demo.toml.
        "sources": {"allow": ["10.0.0.0/8", "127.0.0.0/8"]},
        "policy": {"shard_size_bytes": 262144},
        "p2p": {"host": "0.0.0.0", "port": P2P_PORT},
        "orchestrator": {
            "enabled": True,
            "num_steps": 1000,
            "groups_per_step": 4,
            "exit_when_done": False,
            "progress_interval_s": 10,
            "trainer_launch": {"nproc": 1},
            "trainer": {"optimizer": {"lr": 5e-4}},
        },
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    path = root / "run.toml"
    path.write_text(tomli_w.dumps(config))
    return path


class WanNetwork:
    """The prime network's processes on a :class:`Topology`; every process is the lab's (stopped by PID)."""

    def __init__(self, lab: Lab, topology: Topology, root: Path, sections: dict[str, dict[str, Any]] | None = None):
        self.lab = lab
        self.topology = topology
        self.root = root
        self.env = {"PYTHONPATH": str(REPO_ROOT)}
        self.config_path = run_config(root, topology, sections or {})
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.coordinator_id = ""
        self.relays: list[subprocess.Popen[bytes] | None] = [None] * len(topology.relays)
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * len(topology.workers)
        self.validator: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.topology.url

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET a coordinator route from inside the coordinator's namespace (this process has no route there)."""
        ns = self.topology.coordinator.ns
        done = ns.exec("curl", "-sf", "--max-time", str(timeout_s), f"{self.url}{path}", check=False)
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout else None

    def start_coordinator(self, timeout_s: float = 180.0) -> None:
        argv = [str(BIN / "prime-coordinator"), "start", "-c", str(self.config_path), "--json-logs"]
        self.coordinator = self.lab.start(self.topology.coordinator.ns, "coordinator", argv, self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.coordinator.poll() is not None:
                raise RuntimeError(f"coordinator exited during start-up; see {self.root / 'coordinator.log'}")
            latest = self.get("/v1/policy-versions/latest", timeout_s=2)
            if latest is not None:
                self.coordinator_id = latest["signer"]
                return
            time.sleep(0.5)
        raise RuntimeError(f"coordinator did not answer within {timeout_s} s; see {self.root / 'coordinator.log'}")

    def start_relay(self, index: int) -> subprocess.Popen[bytes]:
        node = self.topology.relays[index]
        port = RELAY_PORT + (index if self.topology.loopback else 0)
        argv = [str(BIN / "prime-relay"), "serve", "--upstream", f"{self.url}/shardcast"]
        argv += ["--host", "0.0.0.0", "--port", str(port), "--coordinator-id", self.coordinator_id]
        argv += ["--data-dir", str(self.root / node.name), "--set", "poll_interval_s=1.0", "--json-logs"]
        argv += ["--set", f'public_url="http://{node.address}:{port}"']
        proc = self.lab.start(node.ns, node.name, argv, self.env)
        self.relays[index] = proc
        return proc

    def start_worker(self, index: int) -> subprocess.Popen[bytes]:
        node = self.topology.workers[index]
        argv = [str(BIN / "prime-worker"), "join", "--coordinator", self.url, "--engine", "hf", "--gpu", "none"]
        argv += ["--data-dir", str(self.root / node.name), "--json-logs"]
        argv += [item for i in range(len(self.topology.relays)) for item in ("--relay", self.topology.relay_url(i))]
        proc = self.lab.start(node.ns, node.name, argv, self.env)
        self.workers[index] = proc
        return proc

    def start_validator(self) -> subprocess.Popen[bytes]:
        node = self.topology.validator
        argv = [str(BIN / "prime-validator"), "run", "--coordinator", self.url]
        argv += ["--data-dir", str(self.root / node.name), "--json-logs"]
        self.validator = self.lab.start(node.ns, node.name, argv, self.env)
        return self.validator

    def start_all(self) -> None:
        self.start_coordinator()
        for index in range(len(self.topology.relays)):
            self.start_relay(index)
        for index in range(len(self.topology.workers)):
            self.start_worker(index)
        self.start_validator()

    def kill_worker(self, index: int) -> None:
        proc = self.workers[index]
        if proc is not None:
            self.lab.kill(proc)
        self.workers[index] = None

    def kill_relay(self, index: int) -> None:
        proc = self.relays[index]
        if proc is not None:
            self.lab.kill(proc)
        self.relays[index] = None

    def check_alive(self) -> None:
        """Raise naming the first node that exited on its own (killed ones are None)."""
        nodes = [("coordinator", self.coordinator), ("validator", self.validator)]
        nodes += [(n.name, p) for n, p in zip(self.topology.relays, self.relays, strict=True)]
        nodes += [(n.name, p) for n, p in zip(self.topology.workers, self.workers, strict=True)]
        for name, proc in nodes:
            if proc is not None and proc.poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def ledger(self, statement: str) -> list[tuple[Any, ...]]:
        return read_ledger(self.root / "run" / "ledger.db", statement)

    def latest_step(self) -> int:
        rows = self.ledger("SELECT MAX(step) FROM train_steps WHERE published_at IS NOT NULL")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def latest_version(self) -> int:
        rows = self.ledger("SELECT MAX(version) FROM policy_versions")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def relay_latest_complete(self, index: int) -> int | None:
        """The newest version relay ``index`` holds whole, asked from inside its namespace."""
        node = self.topology.relays[index]
        url = f"{self.topology.relay_url(index)}/versions"
        done = node.ns.exec("curl", "-sf", "--max-time", "3", url, check=False)
        if done.returncode != 0:
            return None
        listing = json.loads(done.stdout)["versions"]
        complete = [v["version"] for v in listing if v["num_shards_ready"] == v["num_shards"]]
        return max(complete) if complete else None

    def wait_for_step(self, step: int, timeout_s: float, tick: Callable[[], None] | None = None) -> float:
        """Wait until ``step`` is published (``tick`` runs between checks); the time it took."""
        started = time.monotonic()
        while self.latest_step() < step:
            self.check_alive()
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"step {step} not published within {timeout_s:.0f} s (at {self.latest_step()})")
            if tick is not None:
                tick()
            time.sleep(0.5)
        return time.monotonic() - started

    def node_ids(self) -> dict[str, str]:
        """Worker name -> node id (read from each worker's key in its data dir)."""
        from protocol.identity import load_or_create_identity

        return {
            node.name: load_or_create_identity(self.root / node.name).node_id
            for node in self.topology.workers
            if (self.root / node.name / "node_key.pem").exists()
        }

    def stop(self) -> None:
        procs = [*self.workers, self.validator, *self.relays, self.coordinator]
        for proc in procs:
            if proc is not None:
                self.lab.stop(proc, timeout_s=30)


def ledger_audit(path: Path) -> dict[str, Any]:
    """What the ledger says about accepted work: lost (an accepted verdict whose submission is no longer accepted,
    or an accepted task without its group), reused (a task accepted twice, or trained on in two steps), and
    accepted submissions per node id."""
    accepted_events = {
        subject
        for subject, data in read_ledger(path, "SELECT subject, data_json FROM events WHERE kind = 'verdict'")
        if json.loads(data).get("accepted")
    }
    status = dict(read_ledger(path, "SELECT submission_id, status FROM submissions"))
    lost = sorted(s for s in accepted_events if status.get(s) != "accepted")
    groupless = read_ledger(
        path,
        "SELECT t.task_id FROM tasks t LEFT JOIN accepted_groups g ON g.task_id = t.task_id "
        "WHERE t.state = 'accepted' AND g.task_id IS NULL",
    )
    twice_accepted = read_ledger(
        path, "SELECT task_id FROM submissions WHERE status = 'accepted' GROUP BY task_id HAVING COUNT(*) > 1"
    )
    twice_trained = read_ledger(
        path,
        "SELECT s.task_id FROM step_submissions ss JOIN submissions s ON s.submission_id = ss.submission_id "
        "GROUP BY s.task_id HAVING COUNT(*) > 1",
    )
    by_node = dict(
        read_ledger(path, "SELECT node_id, COUNT(*) FROM submissions WHERE status = 'accepted' GROUP BY node_id")
    )
    return {
        "accepted": sum(by_node.values()),
        "accepted_lost": len(lost) + len(groupless),
        "accepted_reused": len(twice_accepted) + len(twice_trained),
        "accepted_by_node": by_node,
        "lost_ids": lost[:10],
    }
