"""Honest workers' share of leases while N Sybil identities from one or many networks flood a real coordinator.

Starts `prime-coordinator start` (SQLite, 256 open leases at most, the default Sybil limits)
and drives it from this process over keep-alive connections bound to distinct loopback
addresses, so the ledger sees distinct sources: ``--sybils`` keys spread over ``--prefixes``
/24 networks (1: all from 127.0.0.1; more: 127.64.0.1, 127.64.1.1, ...) register and then,
every ``--sybil-period-s``, each asks for 64 tasks and never submits (hoarding, the cheapest
attack); after ``--honest-delay-s`` four honest workers, each from a /24 of its own (127.10.0.1,
127.11.0.1, ...), join: heartbeat four times a second, lease two tasks, work ``--work-s`` on each
and submit; a validator (127.9.0.1) accepts what is submitted. It prints ONE JSON object: leases
granted to each side, the honest workers' heartbeat latency, and a ``summary`` with
``honest_lease_share`` (honest leases / all leases granted), per prefix count N
``honest_lease_share_N`` (the same, counted from the moment every honest worker has had a
submission accepted, as probation makes a newcomer earn its place first) and the seconds until
then (``first_verified_s_N``), and ``honest_p99_ms`` (the worst of the runs). ``--prefixes 64 256``
runs one coordinator per count, one after the other.

The Sybil's keys are all registered (the bench raises the registration caps, as if the keys
had been gathered through them over hours: at the defaults one /24 registers 64 at once and
12 a minute after that); the lease limits under test are the defaults. Drives it with the
ledger load bench's client (bench/load_client.py).

    python -m bench.sybil_bench                         # 1000 Sybil keys from one /24, 60 s
    python -m bench.sybil_bench --quick                 # 200 Sybil keys, 15 s
    python -m bench.sybil_bench --prefixes 64 256       # 1000 keys over 64, then 256 /24s, 150 s each
    python -m bench.sybil_bench --quick --prefixes 64 256   # 200 keys, 75 s each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from bench.load_client import Pool, Recorder, SimulatedWorker, cpu_seconds, percentile_ms, registration
from protocol import routes
from protocol.identity import NodeIdentity
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess

REPO_ROOT = Path(__file__).resolve().parents[1]

SYBIL_ADDRESS = "127.0.0.1"
VALIDATOR_ADDRESS = "127.9.0.1"
NUM_HONEST = 4
MAX_OPEN_LEASES = 256
HEARTBEAT_PERIOD_S = 0.25  # far more often than a worker's 10 s, for enough samples of the latency


def honest_address(index: int) -> str:
    return f"127.{10 + index}.0.1"


def sybil_address(prefix: int, num_prefixes: int) -> str:
    """An address in the Sybil's ``prefix``-th /24 network (all of 127.0.0.0/8 is loopback)."""
    if num_prefixes == 1:
        return SYBIL_ADDRESS
    return f"127.{64 + prefix // 256}.{prefix % 256}.1"


def log(message: str) -> None:
    print(f"[sybil_bench] {message}", file=sys.stderr, flush=True)


class Tally:
    """Leases granted per side, and lease calls answered with none."""

    def __init__(self) -> None:
        self.leases = {"honest": 0, "sybil": 0}
        self.empty_answers = {"honest": 0, "sybil": 0}
        self.granted_at: list[float] = []
        """Wall-clock time of each lease granted (one entry per task)."""

    def count(self, side: str, answer: dict[str, Any] | None) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = answer["tasks"] if answer else []
        self.leases[side] += len(tasks)
        self.granted_at += [time.time()] * len(tasks)
        if answer is not None and not tasks:
            self.empty_answers[side] += 1
        return tasks


async def sybil(node: SimulatedWorker, tally: Tally, stop_at: float, period_s: float, rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(rng.uniform(0, 1.0))  # the keys register within a second
    if await node.call("register", routes.NODES_REGISTER, registration("worker")) is None:
        return
    while loop.time() < stop_at:
        tally.count("sybil", await node.call("lease", routes.LEASES, {"v": 1, "max_tasks": 64}))
        await asyncio.sleep(rng.uniform(0.5, 1.5) * period_s)


class Verified:
    """When each honest worker first had a submission accepted (wall clock)."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}
        self.first_at: dict[str, float] = {}

    def submitted(self, node_id: str, submission_id: str | None) -> None:
        if submission_id is not None:
            self.owner[submission_id] = node_id

    def accepted(self, submission_id: str) -> None:
        node_id = self.owner.get(submission_id)
        if node_id is not None:
            self.first_at.setdefault(node_id, time.time())


async def honest(node: SimulatedWorker, tally: Tally, stop_at: float, work_s: float, verified: Verified) -> None:
    loop = asyncio.get_running_loop()
    if await node.call("register", routes.NODES_REGISTER, registration("worker")) is None:
        return

    async def heartbeats() -> None:
        while loop.time() < stop_at:
            beat = {"v": 1, "policy_versions_held": [0], "engine": "vllm", "tokens_per_s": 100.0}
            await node.call("heartbeat", routes.NODES_HEARTBEAT, beat)
            await asyncio.sleep(HEARTBEAT_PERIOD_S)

    beating = asyncio.create_task(heartbeats())
    while loop.time() < stop_at:
        leased = await node.call("lease", routes.LEASES, {"v": 1, "max_tasks": 2, "policy_versions_held": [0]})
        tasks = tally.count("honest", leased)
        if not tasks:
            await asyncio.sleep(max(0.2, leased["retry_after_s"] if leased else 1.0))
            continue
        for task in tasks:
            await asyncio.sleep(work_s)  # generating the rollouts
            verified.submitted(node.identity.node_id, await node.submit(task))
    await beating


async def validator(node: SimulatedWorker, stop_at: float, verified: Verified) -> None:
    loop = asyncio.get_running_loop()
    if await node.call("register", routes.NODES_REGISTER, registration("validator")) is None:
        return
    while loop.time() < stop_at:
        pending = await node.call("pending", f"{routes.SUBMISSIONS_PENDING}?limit=64", None)
        for item in pending["submissions"] if pending else []:
            verdict = {"v": 1, "submission_id": item["submission_id"], "accepted": True}
            answer = await node.call("verdict", routes.VERDICTS, verdict)
            if answer is not None and answer["status"] == "accepted":
                verified.accepted(item["submission_id"])
        await asyncio.sleep(0.2)


async def run_sybils(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The flood (child process): every Sybil key registers, then hoards; the leases it got."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    keys = [NodeIdentity.generate() for _ in range(args.sybils)]  # before the clock starts
    recorder, tally, rng = Recorder(), Tally(), random.Random(1)
    num_prefixes = args.prefixes[0]
    per_pool = max(1, args.connections // num_prefixes)
    pools = [Pool(host, int(port), per_pool, sybil_address(p, num_prefixes)) for p in range(num_prefixes)]
    stop_at = asyncio.get_running_loop().time() + args.duration_s
    nodes = [SimulatedWorker(key, pools[i % num_prefixes], recorder) for i, key in enumerate(keys)]
    await asyncio.gather(*(sybil(node, tally, stop_at, args.sybil_period_s, rng) for node in nodes))
    return {
        "leases": tally.leases["sybil"],
        "granted_at": tally.granted_at,
        "registered": len(recorder.latencies_s["register"]),
        "lease_calls": len(recorder.latencies_s["lease"]),
        "empty_lease_answers": tally.empty_answers["sybil"],
        "lease_p99_ms": percentile_ms(recorder.latencies_s["lease"], 0.99),
        "errors": recorder.error_kinds,
    }


async def run_honest(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The honest side (this process): four workers and a validator, each from a source of its own."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    recorder, tally, verified = Recorder(), Tally(), Verified()
    validator_recorder = Recorder(("register", "pending", "verdict"))
    stop_at = asyncio.get_running_loop().time() + args.duration_s - args.honest_delay_s
    checking = SimulatedWorker(NodeIdentity.generate(), Pool(host, int(port), 2, VALIDATOR_ADDRESS), validator_recorder)
    workers = [
        SimulatedWorker(NodeIdentity.generate(), Pool(host, int(port), 2, honest_address(i)), recorder)
        for i in range(NUM_HONEST)
    ]
    await asyncio.gather(
        validator(checking, stop_at, verified), *(honest(w, tally, stop_at, args.work_s, verified) for w in workers)
    )
    heartbeats = recorder.latencies_s["heartbeat"]
    all_verified_at = max(verified.first_at.values()) if len(verified.first_at) == NUM_HONEST else None
    return {
        "leases": tally.leases["honest"],
        "granted_at": tally.granted_at,
        "all_verified_at": all_verified_at,
        "num_workers_verified": len(verified.first_at),
        "empty_lease_answers": tally.empty_answers["honest"],
        "heartbeats": len(heartbeats),
        "heartbeat_p50_ms": percentile_ms(heartbeats, 0.50),
        "heartbeat_p99_ms": percentile_ms(heartbeats, 0.99),
        "lease_p99_ms": percentile_ms(recorder.latencies_s["lease"], 0.99),
        "submissions": len(recorder.latencies_s["submit"]),
        "verdicts": len(validator_recorder.latencies_s["verdict"]),
        "errors": {**recorder.error_kinds, **validator_recorder.error_kinds},
    }


def run(url: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The Sybil flood in a child process (its signing does not slow the honest side), the honest side here."""
    command = [sys.executable, "-m", "bench.sybil_bench", "--flood", url, "--sybils", str(args.sybils)]
    command += ["--duration-s", str(args.duration_s), "--sybil-period-s", str(args.sybil_period_s)]
    command += ["--connections", str(args.connections), "--prefixes", str(args.prefixes[0])]
    started = time.perf_counter()
    wall_started = time.time()
    flood = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(args.honest_delay_s)  # the Sybil's keys have leased what they could
        honest_side = asyncio.run(run_honest(url, args))
        out, _ = flood.communicate(timeout=args.duration_s + 120)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    if flood.returncode != 0:
        raise RuntimeError(f"the Sybil flood exited with {flood.returncode}")
    sybil_side = json.loads(out)
    total = honest_side["leases"] + sybil_side["leases"]
    verified_at = honest_side.pop("all_verified_at")
    honest_times, sybil_times = honest_side.pop("granted_at"), sybil_side.pop("granted_at")
    after: dict[str, int] | None = None
    if verified_at is not None:
        after = {
            "honest": sum(1 for at in honest_times if at >= verified_at),
            "sybil": sum(1 for at in sybil_times if at >= verified_at),
        }
    return {
        "elapsed_s": round(time.perf_counter() - started, 1),
        "honest_lease_share": round(honest_side["leases"] / total, 4) if total else None,
        "first_verified_s": round(verified_at - wall_started, 1) if verified_at is not None else None,
        "leases_after_verified": after,
        "honest_lease_share_after_verified": (
            round(after["honest"] / (after["honest"] + after["sybil"]), 4) if after and sum(after.values()) else None
        ),
        "honest": honest_side,
        "sybil": sybil_side,
    }


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One coordinator, one flood (``args.prefixes[0]`` networks): the run's result."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sybil-bench-") as tmp:
        workdir = Path(tmp)
        config = {
            "run_name": "bench-sybil",
            "data_dir": str(workdir / "run"),
            "environment": {"type": "python", "target": "bench.ledger_load:BenchEnvironment"},
            "api": {"host": "127.0.0.1", "port": port},
            "scheduling": {
                "prompts_per_task": 2,
                "group_size": 2,
                "max_tokens": 16,
                "max_open_leases": MAX_OPEN_LEASES,
            },
            "trust": {"validators_open": True},
            "sources": {"register_burst": 1_000_000, "prefix_register_burst": 1_000_000},
        }
        config_path = workdir / "sybil.toml"
        config_path.write_text(tomli_w.dumps(config))
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        server = CoordinatorProcess(config_path, workdir / "coordinator.log", env)
        try:
            server.start(url, ("--log-level", "warning"), timeout_s=120)
            log(
                f"coordinator pid {server.pid} on {url}; {args.sybils} Sybil keys over {args.prefixes[0]} /24 "
                f"networks for {args.duration_s} s"
            )
            cpu_before_s = cpu_seconds(server.pid)
            result = run(url, args, env)
            result["server_cpu_share"] = round((cpu_seconds(server.pid) - cpu_before_s) / result["elapsed_s"], 2)
            result["server_log_tail"] = server.log_path.read_text()[-500:]
        finally:
            server.stop()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 Sybil keys, 15 s (75 s with --prefixes > 1)")
    parser.add_argument("--sybils", type=int, default=None, help="Sybil keys (1000; quick 200)")
    parser.add_argument(
        "--prefixes",
        type=int,
        nargs="+",
        default=[1],
        help="/24 networks the Sybil keys are spread over; several values: one run each (e.g. 64 256)",
    )
    parser.add_argument(
        "--duration-s", type=float, default=None, help="seconds of flood (60, 150 with many prefixes; quick 15, 75)"
    )
    parser.add_argument("--sybil-period-s", type=float, default=5.0, help="seconds between one Sybil key's leases")
    parser.add_argument("--honest-delay-s", type=float, default=3.0, help="the honest workers join this much later")
    parser.add_argument("--work-s", type=float, default=0.5, help="an honest worker's time per task")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections the Sybil keys share")
    parser.add_argument("--flood", metavar="URL", help=argparse.SUPPRESS)  # child mode: the Sybil's keys
    args = parser.parse_args(argv)
    if any(count < 1 or count > 16 * 256 for count in args.prefixes):
        parser.error("--prefixes: each count must be between 1 and 4096")
    args.sybils = args.sybils or (200 if args.quick else 1000)
    many = max(args.prefixes) > 1  # newcomers must earn their place: the run lasts past a probation lease or two
    args.duration_s = args.duration_s or ((75.0 if many else 15.0) if args.quick else (150.0 if many else 60.0))
    if args.flood:
        print(json.dumps(asyncio.run(run_sybils(args.flood, args))))
        return
    results = {}
    for count in args.prefixes:
        results[count] = run_once(argparse.Namespace(**{**vars(args), "prefixes": [count]}))
    shares = [r["honest_lease_share"] for r in results.values()]
    summary: dict[str, Any] = {
        "sybil_keys": args.sybils,
        "honest_workers": NUM_HONEST,
        "honest_lease_share": min(shares) if None not in shares else None,
        "honest_p99_ms": max(r["honest"]["heartbeat_p99_ms"] for r in results.values()),
        "honest_leases": sum(r["honest"]["leases"] for r in results.values()),
        "sybil_leases": sum(r["sybil"]["leases"] for r in results.values()),
    }
    for count, result in results.items():
        summary[f"honest_lease_share_{count}"] = result["honest_lease_share_after_verified"]
        summary[f"first_verified_s_{count}"] = result["first_verified_s"]
    print(
        json.dumps(
            {
                "bench": "sybil_bench",
                "sybil_keys": args.sybils,
                "prefixes": args.prefixes,
                "duration_s": args.duration_s,
                "sybil_period_s": args.sybil_period_s,
                "work_s": args.work_s,
                "max_open_leases": MAX_OPEN_LEASES,
                "load_average_1m_after": os.getloadavg()[0],
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "results": {str(count): result for count, result in results.items()},
                "summary": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
