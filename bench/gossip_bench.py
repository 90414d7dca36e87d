"""Gossip latency: how soon a worker starts fetching a policy version after the coordinator publishes it.

Part one runs two :class:`~runtime.p2p.gossip.Gossip` nodes in this process on 127.0.0.1 and
times a dial and announcement delivery (publish call to listener, signature checks included).
Part two starts a real `prime-coordinator start` (tiny built-in-size model, no tasks), a
`prime-worker join --engine hf --gpu none` and an observer peer pinned to the coordinator,
publishes ``--versions`` policy versions with `prime-coordinator publish`, and measures from
the ledger's publication time to the observer receiving the announcement and to the worker
logging that it starts (and finishes) fetching the version. With no tasks to lease, nothing
but gossip makes the worker fetch. Prints ONE JSON object; ``summary`` holds the figures.

    python -m bench.gossip_bench --quick    # 3 versions, under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from bench.polling import wait_until
from protocol import routes
from protocol.announcements import Accepted
from protocol.identity import NodeIdentity
from protocol.schemas import P2PInfo, PolicyAnnouncement
from runtime.children import stop_processes
from runtime.p2p.config import P2PConfig
from runtime.p2p.gossip import Gossip
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess

REPO_ROOT = Path(__file__).resolve().parents[1]

BIN = Path(sys.executable).parent


def in_process(num_messages: int) -> dict[str, Any]:
    """Dial time and publish-to-listener latency between two nodes in this process."""
    coordinator_key, worker_key = NodeIdentity.generate(), NodeIdentity.generate()
    coordinator = Gossip(coordinator_key, P2PConfig(), coordinator_key.node_id)
    worker = Gossip(worker_key, P2PConfig(), coordinator_key.node_id)
    arrivals: dict[int, float] = {}
    arrived = threading.Event()

    def on_policy(accepted: Accepted) -> None:
        assert isinstance(accepted.body, PolicyAnnouncement)
        arrivals[accepted.body.version] = time.perf_counter()
        arrived.set()

    worker.on("policy_version", on_policy)
    coordinator.start()
    worker.start()
    try:
        started = time.perf_counter()
        worker.join(coordinator.info())
        connect_s = time.perf_counter() - started
        time.sleep(1.0)
        latencies = []
        for version in range(1, num_messages + 1):
            arrived.clear()
            body = PolicyAnnouncement(version=version, manifest_sha256="0" * 64, total_size_bytes=0, published_at=0)
            sent = time.perf_counter()
            coordinator.announce(body)
            if arrived.wait(5):
                latencies.append(arrivals[version] - sent)
            time.sleep(0.12)  # py-libp2p's gossipsub forwards at most 10 messages per topic and second
    finally:
        worker.stop()
        coordinator.stop()
    return {"connect_ms": connect_s * 1000, "deliver_ms": [round(x * 1000, 2) for x in latencies]}


def log_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(errors="replace").splitlines() if line.startswith("{")]


def network(workdir: Path, num_versions: int) -> dict[str, Any]:
    """Publication -> announcement at an observer, -> worker fetch start and done, over real processes."""
    from tests.support.tiny_model import save_tiny_qwen2
    from trainer.resolve import resolve_model_path

    checkpoints = [save_tiny_qwen2(workdir / f"policy-{v}", seed=v) for v in range(num_versions + 1)]
    tokenizer_dir = resolve_model_path("builtin:tiny-qwen2")  # the start's tokenizer must encode the prompts
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, checkpoints[0] / name)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "data_dir": str(workdir / "run"),
        "api": {"port": port},
        "policy": {"start_checkpoint": str(checkpoints[0])},
    }
    config_path = workdir / "run.toml"
    config_path.write_text(tomli_w.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    coordinator = CoordinatorProcess(config_path, workdir / "coordinator.log", env)
    worker_log = workdir / "worker.log"
    procs: list[subprocess.Popen[bytes]] = []
    observer: Gossip | None = None
    received: dict[int, float] = {}
    try:
        coordinator.start(url, timeout_s=120)
        info = P2PInfo.model_validate(httpx.get(url + routes.P2P, timeout=5).json())
        observer = Gossip(NodeIdentity.generate(), P2PConfig(), info.peer_id)

        def on_policy(accepted: Accepted) -> None:
            assert isinstance(accepted.body, PolicyAnnouncement)
            received.setdefault(accepted.body.version, time.time())

        observer.on("policy_version", on_policy)
        observer.start()
        observer.join(info)
        argv = [str(BIN / "prime-worker"), "join", "--coordinator", url, "--engine", "hf", "--gpu", "none"]
        argv += ["--data-dir", str(workdir / "worker"), "--json-logs"]
        with worker_log.open("ab") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=log, env=env))
        wait_until(lambda: any("engine(s) ready" in e["event"] for e in log_events(worker_log)), 180, "the worker")
        time.sleep(1.0)
        for version in range(1, num_versions + 1):
            argv = [str(BIN / "prime-coordinator"), "publish", str(checkpoints[version]), "-c", str(config_path)]
            subprocess.run(argv, check=True, capture_output=True, timeout=120)
            wait_until((workdir / "worker" / "policies" / f"v{version}").is_dir, 60, f"v{version}")
        events = httpx.get(url + routes.EVENTS, params={"after": 0, "limit": 1000}, timeout=5).json()["events"]
    finally:
        if observer is not None:
            observer.stop()
        stop_processes(procs)
        coordinator.stop()
    published = {int(e["subject"]): float(e["at"]) for e in events if e["kind"] == "publish"}
    worker_events = log_events(worker_log)

    def logged(version: int, marker: str) -> float:
        return next(
            float(e["ts"]) for e in worker_events if e.get("p2p_event") == marker and e["policy_version"] == version
        )

    rows = []
    for version in range(1, num_versions + 1):
        at = published[version]
        rows.append(
            {
                "version": version,
                "announcement_received_s": round(received[version] - at, 3),
                "fetch_start_s": round(logged(version, "fetch_start") - at, 3),
                "fetch_done_s": round(logged(version, "fetch_done") - at, 3),
            }
        )
    return {"versions": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 versions, 20 in-process messages")
    parser.add_argument("--versions", type=int, default=None, help="policy versions to publish (default 10; quick 3)")
    args = parser.parse_args(argv)
    num_versions = args.versions or (3 if args.quick else 10)
    local = in_process(20 if args.quick else 200)
    with tempfile.TemporaryDirectory(prefix="gossip-bench-") as tmp:
        net = network(Path(tmp), num_versions)
    starts = [row["fetch_start_s"] for row in net["versions"]]
    announced = [row["announcement_received_s"] for row in net["versions"]]
    summary = {
        "publication_to_fetch_start_s_median": round(statistics.median(starts), 3),
        "publication_to_fetch_start_s_max": max(starts),
        "publication_to_announcement_s_median": round(statistics.median(announced), 3),
        "gossip_deliver_ms_median": round(statistics.median(local["deliver_ms"]), 2),
        "connect_ms": round(local["connect_ms"], 1),
    }
    machine = {"python": platform.python_version(), "cpus": os.cpu_count()}
    print(json.dumps({"summary": summary, "in_process": local, "network": net, "machine": machine}))


if __name__ == "__main__":
    main()
