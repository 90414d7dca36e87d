"""The emulated WAN lab: the prime network in network namespaces on rate-limited links, behind a NAT, under churn.

Builds (tests/support/netlab.py, tests/support/wan_network.py) a namespace per node: the
coordinator (with its torchrun trainer) and 2 relays on 1000 Mbit/s links to a core router, 2
workers on 100 and 200 Mbit/s links to it, and behind a NAT router 2 more workers (100 and 150
Mbit/s) and the validator (200 Mbit/s), which nothing outside can connect to. The nodes are the
real CLIs (``prime-coordinator start``, ``prime-relay serve``, ``prime-worker join --engine hf``,
``prime-validator run``) started with ``ip netns exec``; every byte between them crosses the links.
The workload is the demo's (reverse_text, 4 prompts x 8 samples, 32 tokens, async level 1; full
versions every 10th step and value patches in between), with 4 groups a step and one trainer rank.

Phases, in one run:

1. **loopback**: the same workload and configuration with every node in one namespace on 127.0.0.1:
   steps/hour between the end of warm-up and the last steady step.
2. **WAN steady state**: the same over the lab's links (``wan_steps_per_hour``, ``wan_over_loopback``).
3. **churn** (same WAN run, continued): every few seconds a random worker is killed with SIGKILL and
   restarted (same key and data dir) a few seconds later; relay-0 is killed and restarted; relay-1 is
   cut from everything (every packet on its link dropped) for 30 s and healed: ``partition_recovery_s``
   is from the heal to relay-1 serving the coordinator's newest version whole again. At the end the
   ledger is audited: ``accepted_lost`` (accepted verdicts whose submission is no longer accepted, or
   accepted tasks without their group) and ``accepted_reused`` (a task accepted twice or trained on in
   two steps); ``nat_workers_accepted`` counts accepted submissions of the NAT'd workers.
4. **broadcast**: a fresh lab of the same links with no RL run: ``prime-relay origin`` in the
   coordinator's namespace, ``prime-relay serve`` in the relays', and a warm download client in each
   worker's namespace. One synthetic checkpoint (160 MiB; 104 MiB with ``--quick``) is published;
   clients are told its version as soon as both relays list it. ``broadcast_efficiency`` is
   policy bytes / (time from publication to the last client holding it verified x the slowest
   worker link rate).

What the lab does not emulate: latency and jitter (no ``netem``), packet loss, MTU, real NAT
timeouts; every node shares this machine's CPUs, so steps/hour also pays for the CPU the
emulation takes.

    python -m bench.netlab --quick     # 5 steady steps a side, 104 MiB broadcast
    python -m bench.netlab             # 10 steady steps a side, 160 MiB broadcast: ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.netlab import Lab, namespaces_unavailable
from tests.support.wan_network import WanNetwork, WanSpec, build_loopback, build_wan, ledger_audit

BIN = Path(sys.executable).parent
MIB = 1024 * 1024
PARTITION_S = 30.0


def log(message: str) -> None:
    print(f"[netlab {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def steady_rate(net: WanNetwork, warmup_steps: int, steady_steps: int, timeout_s: float) -> dict[str, Any]:
    net.wait_for_step(warmup_steps, timeout_s)
    first = net.latest_step()
    started = time.monotonic()
    net.wait_for_step(first + steady_steps, timeout_s)
    elapsed = time.monotonic() - started
    steps = net.latest_step() - first
    return {"steps": steps, "elapsed_s": round(elapsed, 1), "steps_per_hour": round(3600 * steps / elapsed, 1)}


def run_loopback(root: Path, spec: WanSpec, warmup: int, steps: int) -> dict[str, Any]:
    with Lab(root) as lab:
        net = WanNetwork(lab, build_loopback(lab, spec), root)
        net.start_all()
        try:
            return steady_rate(net, warmup, steps, timeout_s=900)
        finally:
            net.stop()


class Churn:
    """Kills a random worker every ``interval_s`` and restarts it ``down_s`` later (called from a wait loop)."""

    def __init__(self, net: WanNetwork, interval_s: float, down_s: float, seed: int = 0) -> None:
        self.net = net
        self.interval_s = interval_s
        self.down_s = down_s
        self.rng = random.Random(seed)
        self.next_kill = time.monotonic() + interval_s
        self.down: dict[int, float] = {}
        self.num_kills = 0

    def __call__(self) -> None:
        now = time.monotonic()
        for index, since in list(self.down.items()):
            if now - since >= self.down_s:
                self.net.start_worker(index)
                del self.down[index]
        if now >= self.next_kill:
            alive = [i for i in range(len(self.net.workers)) if i not in self.down]
            index = self.rng.choice(alive)
            self.net.kill_worker(index)
            self.down[index] = now
            self.num_kills += 1
            self.next_kill = now + self.interval_s

    def restart_all(self) -> None:
        for index in list(self.down):
            self.net.start_worker(index)
        self.down.clear()


def sleep_ticking(net: WanNetwork, seconds: float, tick: Churn) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        net.check_alive()
        tick()
        time.sleep(0.25)


def run_wan(root: Path, spec: WanSpec, warmup: int, steps: int, churn_interval_s: float) -> dict[str, Any]:
    with Lab(root) as lab:
        topology = build_wan(lab, spec)
        net = WanNetwork(lab, topology, root)
        net.start_all()
        try:
            steady = steady_rate(net, warmup, steps, timeout_s=900)
            log(f"WAN steady state: {steady}")
            step_before_churn = net.latest_step()
            churn = Churn(net, churn_interval_s, down_s=3.0)
            log("churn: relay-0 killed")
            net.kill_relay(0)
            sleep_ticking(net, 15, churn)
            net.start_relay(0)
            log("churn: relay-0 restarted; relay-1 partitioned")
            relay_link = topology.relays[1].link
            assert relay_link is not None
            lab.partition(relay_link)
            version_at_partition = net.latest_version()
            sleep_ticking(net, PARTITION_S, churn)
            lab.heal(relay_link)
            healed = time.monotonic()
            version_at_heal = net.latest_version()
            log(f"churn: relay-1 healed (versions {version_at_partition} -> {version_at_heal} while cut)")
            recovery_s: float | None = None
            while time.monotonic() - healed < 180:
                churn()
                net.check_alive()
                held = net.relay_latest_complete(1)
                if held is not None and held >= net.latest_version():
                    recovery_s = time.monotonic() - healed
                    break
                time.sleep(0.2)
            log(f"churn: relay-1 serves the newest version again after {recovery_s} s")
            sleep_ticking(net, 10, churn)
            churn.restart_all()
            churn_steps = net.latest_step() - step_before_churn
            # Let what was submitted during the churn be validated before the audit.
            net.wait_for_step(net.latest_step() + 2, 300)
            audit = ledger_audit(root / "run" / "ledger.db")
            ids = net.node_ids()
            nat_ids = [ids[node.name] for node in topology.workers if node.nat and node.name in ids]
            kinds = net.ledger("SELECT manifest_json FROM policy_versions")
            num_patches = sum(1 for (m,) in kinds if json.loads(m).get("kind") == "patch")
            return {
                "steady": steady,
                "churn": {
                    "worker_kills": churn.num_kills,
                    "relay_kills": 1,
                    "partition_s": PARTITION_S,
                    "versions_published_while_cut": version_at_heal - version_at_partition,
                    "steps_during_churn": churn_steps,
                },
                "partition_recovery_s": None if recovery_s is None else round(recovery_s, 2),
                "audit": audit,
                "nat_workers_accepted": sum(audit["accepted_by_node"].get(i, 0) for i in nat_ids),
                "accepted_by_worker": {name: audit["accepted_by_node"].get(i, 0) for name, i in ids.items()},
                "policy_versions": {"full": len(kinds) - num_patches, "patch": num_patches},
            }
        finally:
            net.stop()


CLIENT = r"""
import json, sys, time
from pathlib import Path
from shardcast.client.download import download_version
from shardcast.client.transfer import TransferOptions

relays, coordinator_id, out = sys.argv[1].split(","), sys.argv[2], Path(sys.argv[3])
print("ready", flush=True)
version = int(sys.stdin.readline())
counts = {}
def count(event):
    counts[event["event"]] = counts.get(event["event"], 0) + 1
options = TransferOptions(fsync_enabled=False, **json.loads(sys.argv[4]))
download_version(version, relays, coordinator_id, out, options, on_event=count)
print("done", time.monotonic(), flush=True)
print(json.dumps(counts), flush=True)
"""


def wait_done(proc: subprocess.Popen[bytes], started: float) -> float:
    """Seconds from ``started`` to the client's "done <monotonic clock>" (one clock for every namespace)."""
    assert proc.stdout is not None
    said = proc.stdout.readline().split()
    if len(said) != 2 or said[0] != b"done":
        raise RuntimeError(f"a download client failed (said {said!r}); see its log")
    return round(float(said[1]) - started, 2)


def run_broadcast(root: Path, spec: WanSpec, size_bytes: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
    from protocol.identity import load_or_create_identity
    from shardcast.format.store import VersionStore
    from shardcast.origin.publish import publish_checkpoint
    from tests.support.shardcast_nodes import make_checkpoint

    checkpoint = make_checkpoint(root / "checkpoint", seed=1, size_bytes=size_bytes)
    policy_bytes = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    identity = load_or_create_identity(root / "origin-key")
    with Lab(root) as lab:
        topology = build_wan(lab, spec)
        coordinator = topology.coordinator
        origin = f"http://{coordinator.address}:8000"
        lab.start(coordinator.ns, "origin", [str(BIN / "prime-relay"), "origin", "--store", str(root / "store"),
                                             "--host", coordinator.address, "--port", "8000"])  # fmt: skip
        relay_urls = []
        for index, node in enumerate(topology.relays):
            url = f"http://{node.address}:8100"
            argv = [str(BIN / "prime-relay"), "serve", "--upstream", origin, "--host", node.address, "--port", "8100"]
            argv += ["--coordinator-id", identity.node_id, "--data-dir", str(root / f"relay-{index}")]
            argv += ["--set", "poll_interval_s=0.2", "--no-p2p"]
            lab.start(node.ns, node.name, argv)
            relay_urls.append(url)
        env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        clients = []
        for node in topology.workers:
            argv = [sys.executable, "-c", CLIENT, ",".join(relay_urls), identity.node_id, str(root / node.name)]
            argv.append(json.dumps(options or {}))
            clients.append(lab.start(node.ns, node.name, argv, env, stdout=subprocess.PIPE, stdin=subprocess.PIPE))
        for proc in clients:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a download client did not start; see {root}")

        def listed(index: int) -> bool:
            done = topology.relays[index].ns.exec("curl", "-sf", f"{relay_urls[index]}/versions", check=False)
            return done.returncode == 0 and any(v["version"] == 1 for v in json.loads(done.stdout)["versions"])

        for index in range(len(relay_urls)):
            deadline = time.monotonic() + 30
            while not topology.relays[index].ns.exec("curl", "-sf", f"{relay_urls[index]}/healthz", check=False).stdout:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"relay {relay_urls[index]} did not start")
                time.sleep(0.1)
        publish_checkpoint(checkpoint, 1, identity, VersionStore(root / "store"), shard_size_bytes=4 * MIB)
        started = time.monotonic()
        while not all(listed(i) for i in range(len(relay_urls))):
            time.sleep(0.02)
        listed_s = time.monotonic() - started
        for proc in clients:
            assert proc.stdin is not None
            proc.stdin.write(b"1\n")
            proc.stdin.flush()
        per_client = [wait_done(proc, started) for proc in clients]
        elapsed = max(per_client)
        events = [json.loads(proc.stdout.readline()) for proc in clients if proc.stdout is not None]
    slowest_mbit = min(node.rate_mbit or 0.0 for node in topology.workers)
    ideal_s = policy_bytes * 8 / (slowest_mbit * 1e6)
    return {
        "policy_bytes": policy_bytes,
        "relays_listed_s": round(listed_s, 2),
        "client_done_s": per_client,
        "client_events": events,
        "broadcast_s": round(elapsed, 2),
        "slowest_worker_mbit": slowest_mbit,
        "ideal_s": round(ideal_s, 2),
        "broadcast_efficiency": round(ideal_s / elapsed, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps, shorter churn, a 104 MiB policy")
    parser.add_argument("--dir", type=Path, default=Path("runs/netlab"))
    args = parser.parse_args()
    reason = namespaces_unavailable()
    if reason is not None:
        raise SystemExit(f"bench.netlab: {reason}")
    warmup, steps = (2, 5) if args.quick else (3, 10)
    size = (104 if args.quick else 160) * MIB
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    spec = WanSpec()
    for name in ("loopback", "wan", "broadcast"):
        (root / name).mkdir(parents=True)
    log("loopback run")
    loopback = run_loopback(root / "loopback", spec, warmup, steps)
    log(f"loopback: {loopback}")
    log("WAN run")
    wan = run_wan(root / "wan", spec, warmup, steps, churn_interval_s=8.0 if args.quick else 5.0)
    log("broadcast")
    broadcast = run_broadcast(root / "broadcast", spec, size)
    log(f"broadcast: {broadcast}")
    summary = {
        "wan_steps_per_hour": wan["steady"]["steps_per_hour"],
        "loopback_steps_per_hour": loopback["steps_per_hour"],
        "wan_over_loopback": round(wan["steady"]["steps_per_hour"] / loopback["steps_per_hour"], 3),
        "broadcast_efficiency": broadcast["broadcast_efficiency"],
        "accepted_lost": wan["audit"]["accepted_lost"],
        "accepted_reused": wan["audit"]["accepted_reused"],
        "partition_recovery_s": wan["partition_recovery_s"],
        "nat_workers_accepted": wan["nat_workers_accepted"],
    }
    report = {
        "summary": summary,
        "links_mbit": {
            "coordinator_and_relays": spec.backbone_mbit,
            "public_workers": spec.public_worker_mbit,
            "nat_workers": spec.nat_worker_mbit,
            "validator_behind_nat": spec.validator_mbit,
        },
        "loopback": loopback,
        "wan": wan,
        "broadcast": broadcast,
        "quick": args.quick,
        "not_emulated": ["latency", "jitter", "packet loss", "MTU", "NAT timeouts"],
        "run_dir": str(root),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
