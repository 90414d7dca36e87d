"""Workers in a real network: coordinator, relay and `prime-worker join` processes on 127.0.0.1.

Two workers (vLLM and HF engines) complete tasks across two policy versions, and a real
`prime-validator run` accepts every submission (proofs, sampling replay, logprobs checked
against an HF prefill of the version each claims); a worker
SIGKILLed mid-task has its lease re-issued and the group completed by the other; a worker
whose only relay is down when a new version is published finishes once the relay is back; a
worker that cheats (altered tokens, flipped proof signs, another temperature) is rejected by
the validator on every submission and banned, while honest work goes on being accepted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from coordinator.process import CoordinatorProcess, stop_processes
from protocol.errors import ForbiddenError
from protocol.identity import NodeIdentity, load_or_create_identity
from protocol.ledger_client import LedgerClient
from protocol.schemas import Hardware, LeaseRequest, RegisterRequest
from tests.conftest import free_port
from tests.integration.shardcast_nodes import Nodes, wait_until
from tests.ledger_helpers import TASK_NAME
from toploc.tiny_model import TINY_EOS_TOKEN_ID, TinyModelSpec, save_tiny_qwen2
from worker.adversary import altered_token, flipped_signs, other_temperature, sample_tasks_of, submission_of
from worker.engines.hf import HFEngine

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# head_dim 32 (vLLM's CPU attention needs 32 and up); 16 KiB shards so a version has many.
SPEC = TinyModelSpec(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)


@dataclass
class Network:
    url: str
    root: Path
    config_path: Path
    coordinator: CoordinatorProcess
    coordinator_id: str
    checkpoints: list[Path]
    relays: Nodes
    workers: list[subprocess.Popen[bytes]]

    def start_worker(self, name: str, engine: str, relays: list[str], *extra: str) -> subprocess.Popen[bytes]:
        argv = [str(BIN / "prime-worker"), "join", "--coordinator", self.url, "--engine", engine, "--gpu", "none"]
        argv += ["--data-dir", str(self.root / name), "--json-logs", *extra]
        argv += [item for relay in relays for item in ("--relay", relay)]
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self.workers.append(proc)
        return proc

    def start_validator(self) -> subprocess.Popen[bytes]:
        argv = [
            str(BIN / "prime-validator"),
            "run",
            "--coordinator",
            self.url,
            "--data-dir",
            str(self.root / "validator"),
        ]
        log = open(self.root / "validator.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [*argv, "--json-logs"], stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        )
        self.workers.append(proc)
        return proc

    def publish(self, version: int) -> None:
        argv = [str(BIN / "prime-coordinator"), "publish", str(self.checkpoints[version]), "-c", str(self.config_path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            page = httpx.get(f"{self.url}/v1/events", params={"after": after, "limit": 1000}, timeout=5).json()
            found += [e for e in page["events"] if kind is None or e["kind"] == kind]
            if not page["events"]:
                return found
            after = page["next_after"]

    def worker_log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    checkpoints = [save_tiny_qwen2(tmp_path / f"policy-{v}", seed=v, spec=SPEC) for v in range(2)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "workers",
        "data_dir": str(tmp_path / "run"),
        "task": TASK_NAME,
        "task_source": "tests.ledger_helpers:CountingTaskSource",
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 100000, "ip_burst": 100000},
        "scheduling": {"prompts_per_task": 2, "group_size": 4, "max_tokens": 48, "lease_ttl_s": 8, "async_level": 1},
        "trust": {"validators_open": True},
        "policy": {"start_checkpoint": str(checkpoints[0]), "shard_size_bytes": 16384},
    }
    config_path = tmp_path / "run.toml"
    config_path.write_text(tomli_w.dumps(config))
    coordinator = CoordinatorProcess(config_path, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    relays = Nodes(tmp_path)
    net = Network(url, tmp_path, config_path, coordinator, "", checkpoints, relays, [])
    try:
        coordinator.start(url, timeout_s=120)
        net.coordinator_id = httpx.get(f"{url}/v1/policy-versions/latest", timeout=5).json()["signer"]
        yield net
    finally:
        stop_processes(net.workers)
        relays.stop_all()
        coordinator.stop()


def submissions_by_node(net: Network) -> dict[str, list[dict[str, Any]]]:
    by_node: dict[str, list[dict[str, Any]]] = {}
    for event in net.events("submit"):
        by_node.setdefault(event["node_id"], []).append(event)
    return by_node


def test_two_engines_across_two_versions_and_a_killed_worker(network: Network) -> None:
    net = network
    relay_url, _ = net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id)
    vllm_worker = net.start_worker("worker-vllm", "vllm", [relay_url])
    hf_worker = net.start_worker("worker-hf", "hf", [relay_url])

    def both_submitted(version: int) -> bool:
        nodes = submissions_by_node(net)
        done = [sum(1 for e in events if e["data"].get("policy_version") == version) for events in nodes.values()]
        return len(done) == 2 and all(count >= 1 for count in done)

    wait_until(lambda: both_submitted(0), 240, "both workers to submit under policy v0")
    net.publish(1)
    wait_until(lambda: both_submitted(1), 180, "both workers to submit under policy v1")
    assert vllm_worker.poll() is None, net.worker_log("worker-vllm")
    assert hf_worker.poll() is None, net.worker_log("worker-hf")

    # SIGKILL the HF worker while it holds a lease: the lease expires and the vLLM worker completes the group.
    hf_id = load_or_create_identity(net.root / "worker-hf").node_id

    def hf_holds_lease() -> bool:
        leased = {e["data"]["task_id"] for e in net.events("lease") if e["node_id"] == hf_id}
        submitted = {e["data"]["task_id"] for e in net.events("submit") if e["node_id"] == hf_id}
        return bool(leased - submitted)

    try:
        wait_until(hf_holds_lease, 120, "the HF worker to hold a lease")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; HF worker exit code {hf_worker.poll()}:\n{net.worker_log('worker-hf')}") from exc
    os.kill(hf_worker.pid, signal.SIGKILL)
    hf_worker.wait()
    leased = {e["data"]["task_id"] for e in net.events("lease") if e["node_id"] == hf_id}
    orphaned = leased - {e["data"]["task_id"] for e in net.events("submit") if e["node_id"] == hf_id}
    assert orphaned

    def orphans_completed() -> bool:
        completed = {e["data"]["task_id"] for e in net.events("submit") if e["node_id"] != hf_id}
        return orphaned <= completed

    wait_until(orphans_completed, 120, "the other worker to complete the killed worker's groups")
    os.kill(vllm_worker.pid, signal.SIGTERM)  # Ctrl-C: abandons or finishes its lease and exits
    assert vllm_worker.wait(timeout=60) == 130, net.worker_log("worker-vllm")

    # A real validator audits every submission: all pass (proofs, sampling replay, logprobs), from both engines.
    validator = net.start_validator()

    def all_audited() -> bool:
        status = httpx.get(f"{net.url}/v1/status", timeout=5).json()
        return bool(status["num_submissions_pending"] == 0)

    wait_until(all_audited, 300, "the validator to audit every submission")
    assert validator.poll() is None, net.worker_log("validator")
    engine_of = {e["subject"]: e["data"]["engine"] for e in net.events("submit")}
    verdicts = net.events("verdict")
    rejected = [e["data"]["reasons"] for e in verdicts if not e["data"]["accepted"]]
    assert verdicts and not rejected, rejected[:3]
    assert {engine_of[e["subject"]] for e in verdicts} == {"vllm", "hf"}


def test_worker_finishes_after_its_relay_restarts(network: Network) -> None:
    net = network
    relay_url, relay = net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id)
    port = relay_url.rsplit(":", 1)[1]
    worker = net.start_worker("worker", "hf", [relay_url], "--set", "origin_fallback_enabled=false")
    wait_until(lambda: bool(submissions_by_node(net)), 180, "the worker to submit under policy v0")
    net.relays.stop(relay)
    net.publish(1)
    time.sleep(3)  # the worker now needs v1 and has no relay to get it from
    assert worker.poll() is None, net.worker_log("worker")
    net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id, port=int(port))

    def submitted_v1() -> bool:
        return any(e["data"].get("policy_version") == 1 for e in net.events("submit"))

    wait_until(submitted_v1, 180, "the worker to submit under policy v1 after the relay came back")
    assert worker.poll() is None, net.worker_log("worker")
    status = subprocess.run(
        [str(BIN / "prime-worker"), "status", "--coordinator", net.url, "--data-dir", str(net.root / "worker")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    node_id = load_or_create_identity(net.root / "worker").node_id
    assert status.returncode == 0, status.stderr
    assert f"node {node_id} (worker): 0 accepted, 0 rejected" in status.stdout


async def cheat_until_banned(url: str, checkpoint: Path, num_cheats: int) -> tuple[str, str, list[str]]:
    """A dishonest worker speaking the public protocol: each leased task answered by a different cheat."""
    policy = HFEngine(checkpoint, max_batch_size=16)
    cheats = [
        lambda tasks: altered_token(policy, tasks),
        lambda tasks: flipped_signs(policy, tasks),
        lambda tasks: other_temperature(policy, tasks, 0.5),
    ]
    identity = NodeIdentity.generate()
    submitted: list[str] = []
    async with LedgerClient(url, identity) as ledger:
        hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=2**30)
        await ledger.register(RegisterRequest(role="worker", hardware=hardware, engine="hf", software_version="evil"))
        while len(submitted) < num_cheats:
            leased = await ledger.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))
            if not leased.tasks:
                await asyncio.sleep(0.2)
                continue
            task = leased.tasks[0]
            claims = cheats[len(submitted) % len(cheats)](sample_tasks_of(task, (TINY_EOS_TOKEN_ID,)))
            submitted.append((await ledger.submit(submission_of(task, claims))).submission_id)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the validator's verdicts ban the node
            try:
                await ledger.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))
            except ForbiddenError as exc:
                return identity.node_id, exc.message, submitted
            await asyncio.sleep(1)
    raise AssertionError("the cheating worker was never banned")


def test_cheating_worker_is_rejected_and_banned_while_honest_work_is_accepted(network: Network) -> None:
    net = network
    net.start_worker("worker-honest", "hf", [])
    validator = net.start_validator()
    cheater, ban_reason, cheated = asyncio.run(cheat_until_banned(net.url, net.checkpoints[0], num_cheats=3))
    assert "reject" in ban_reason.lower(), ban_reason
    assert validator.poll() is None, net.worker_log("validator")
    verdicts = {e["subject"]: e["data"] for e in net.events("verdict")}
    assert all(submission in verdicts and not verdicts[submission]["accepted"] for submission in cheated)
    assert all(verdicts[s]["reasons"] for s in cheated)
    honest = [data for subject, data in verdicts.items() if subject not in cheated]
    assert honest and all(data["accepted"] for data in honest)
    bans = net.events("ban")
    assert [ban["node_id"] for ban in bans] == [cheater]
