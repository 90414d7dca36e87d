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
import time
from pathlib import Path

import httpx
import pytest

from engines.hf import HFEngine
from protocol.identity import load_or_create_identity
from protocol.ledger_client import LedgerClient
from tests.support.malicious_worker import Attacker
from tests.support.network import BIN, Network, submissions_by_node
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow


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
        # One read of the (append-only) event log: with a lease read and a submission read made one after the
        # other, a task the fast HF worker leased and submitted within a read was never seen held.
        events = [e for e in net.events() if e["node_id"] == hf_id]
        leased = {e["data"]["task_id"] for e in events if e["kind"] == "lease"}
        submitted = {e["data"]["task_id"] for e in events if e["kind"] == "submit"}
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
    assert "credit: 0 verified samples (0 tokens)" in status.stdout


async def cheat_until_banned(url: str, checkpoint: Path) -> tuple[str, str, list[str]]:
    """A dishonest worker speaking the public protocol: each leased task answered by a different cheat."""
    attacker = Attacker(url, HFEngine(checkpoint, max_batch_size=16))
    async with LedgerClient(url, attacker.identity) as ledger:
        await attacker.register(ledger)
        await attacker.proof_attacks(ledger, ["altered_completion_token", "flipped_signs", "other_temperature_half"])
        ban_reason = await attacker.wait_for_ban(ledger, 240)
    submitted = [outcome.submission_id for outcome in attacker.outcomes if outcome.submission_id]
    return attacker.identity.node_id, ban_reason, submitted


def test_cheating_worker_is_rejected_and_banned_while_honest_work_is_accepted(network: Network) -> None:
    net = network
    net.start_worker("worker-honest", "hf", [])
    validator = net.start_validator()
    cheater, ban_reason, cheated = asyncio.run(cheat_until_banned(net.url, net.checkpoints[0]))
    assert "reject" in ban_reason.lower(), ban_reason
    assert validator.poll() is None, net.worker_log("validator")

    # The cheater can be banned before the slower honest worker's first submission is judged.
    wait_until(lambda: bool(set(net.verdicts()) - set(cheated)), 180, "a verdict on honest work")
    verdicts = net.verdicts()
    assert all(submission in verdicts and not verdicts[submission]["accepted"] for submission in cheated)
    assert all(verdicts[s]["reasons"] for s in cheated)
    by_honest_worker = {e["subject"] for e in net.events("submit") if e["node_id"] != cheater}
    honest = [(subject, data) for subject, data in verdicts.items() if subject in by_honest_worker]
    assert honest
    assert [(subject, data) for subject, data in honest if not data["accepted"]] == []
    assert set(verdicts) <= by_honest_worker | set(cheated), "every verdict is on the honest worker's or a cheat"
    bans = net.events("ban")
    assert [ban["node_id"] for ban in bans] == [cheater]
