"""Honest workers' share of leases while N Sybil identities from one source flood a real coordinator.

Starts `prime-coordinator start` (SQLite, 256 open leases at most, the default Sybil limits)
and drives it from this process over keep-alive connections bound to distinct loopback
addresses, so the ledger sees distinct sources: ``--sybils`` keys from 127.0.0.1 (one /24)
register and then, every ``--sybil-period-s``, each asks for 64 tasks and never submits
(hoarding, the cheapest attack); after ``--honest-delay-s`` four honest workers, each from a
/24 of its own (127.10.0.1, 127.11.0.1, ...), join: heartbeat four times a second, lease two tasks,
work ``--work-s`` on each and submit; a validator (127.9.0.1) accepts what is submitted. It
prints ONE JSON object: leases granted to each side, the honest workers' heartbeat latency, and
a ``summary`` with ``honest_lease_share`` (honest leases / all leases granted) and
``honest_p99_ms``.

The Sybil's keys are all registered (the bench raises the registration caps, as if the keys
had been gathered through them over hours: at the defaults one /24 registers 64 at once and
12 a minute after that); the lease limits under test are the defaults. Reuses the load
generator's pieces of bench/ledger_load.py.

    python -m bench.sybil_bench            # 1000 Sybil keys, 60 s
    python -m bench.sybil_bench --quick    # 200 Sybil keys, 15 s
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

from bench.ledger_load import Pool, Recorder, SimulatedWorker, cpu_seconds, percentile_ms, registration
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


def log(message: str) -> None:
    print(f"[sybil_bench] {message}", file=sys.stderr, flush=True)


class Tally:
    """Leases granted per side, and lease calls answered with none."""

    def __init__(self) -> None:
        self.leases = {"honest": 0, "sybil": 0}
        self.empty_answers = {"honest": 0, "sybil": 0}

    def count(self, side: str, answer: dict[str, Any] | None) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = answer["tasks"] if answer else []
        self.leases[side] += len(tasks)
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


async def honest(node: SimulatedWorker, tally: Tally, stop_at: float, work_s: float) -> None:
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
            await node.submit(task)
    await beating


async def validator(node: SimulatedWorker, stop_at: float) -> None:
    loop = asyncio.get_running_loop()
    if await node.call("register", routes.NODES_REGISTER, registration("validator")) is None:
        return
    while loop.time() < stop_at:
        pending = await node.call("pending", f"{routes.SUBMISSIONS_PENDING}?limit=64", None)
        for item in pending["submissions"] if pending else []:
            verdict = {"v": 1, "submission_id": item["submission_id"], "accepted": True}
            await node.call("verdict", routes.VERDICTS, verdict)
        await asyncio.sleep(0.2)


async def run_sybils(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The flood (child process): every Sybil key registers, then hoards; the leases it got."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    keys = [NodeIdentity.generate() for _ in range(args.sybils)]  # before the clock starts
    recorder, tally, rng = Recorder(), Tally(), random.Random(1)
    pool = Pool(host, int(port), args.connections, SYBIL_ADDRESS)
    stop_at = asyncio.get_running_loop().time() + args.duration_s
    nodes = [SimulatedWorker(key, pool, recorder) for key in keys]
    await asyncio.gather(*(sybil(node, tally, stop_at, args.sybil_period_s, rng) for node in nodes))
    return {
        "leases": tally.leases["sybil"],
        "registered": len(recorder.latencies_s["register"]),
        "lease_calls": len(recorder.latencies_s["lease"]),
        "empty_lease_answers": tally.empty_answers["sybil"],
        "lease_p99_ms": percentile_ms(recorder.latencies_s["lease"], 0.99),
        "errors": recorder.error_kinds,
    }


async def run_honest(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The honest side (this process): four workers and a validator, each from a source of its own."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    recorder, tally = Recorder(), Tally()
    validator_recorder = Recorder(("register", "pending", "verdict"))
    stop_at = asyncio.get_running_loop().time() + args.duration_s - args.honest_delay_s
    checking = SimulatedWorker(NodeIdentity.generate(), Pool(host, int(port), 2, VALIDATOR_ADDRESS), validator_recorder)
    workers = [
        SimulatedWorker(NodeIdentity.generate(), Pool(host, int(port), 2, honest_address(i)), recorder)
        for i in range(NUM_HONEST)
    ]
    await asyncio.gather(validator(checking, stop_at), *(honest(w, tally, stop_at, args.work_s) for w in workers))
    heartbeats = recorder.latencies_s["heartbeat"]
    return {
        "leases": tally.leases["honest"],
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
    command += ["--connections", str(args.connections)]
    started = time.perf_counter()
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
    return {
        "elapsed_s": round(time.perf_counter() - started, 1),
        "honest_lease_share": round(honest_side["leases"] / total, 4) if total else None,
        "honest": honest_side,
        "sybil": sybil_side,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 Sybil keys, 15 s")
    parser.add_argument("--sybils", type=int, default=None, help="Sybil keys from one source (1000; quick 200)")
    parser.add_argument("--duration-s", type=float, default=None, help="seconds of flood (60; quick 15)")
    parser.add_argument("--sybil-period-s", type=float, default=5.0, help="seconds between one Sybil key's leases")
    parser.add_argument("--honest-delay-s", type=float, default=3.0, help="the honest workers join this much later")
    parser.add_argument("--work-s", type=float, default=0.5, help="an honest worker's time per task")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections the Sybil keys share")
    parser.add_argument("--flood", metavar="URL", help=argparse.SUPPRESS)  # child mode: the Sybil's keys
    args = parser.parse_args(argv)
    args.sybils = args.sybils or (200 if args.quick else 1000)
    args.duration_s = args.duration_s or (15.0 if args.quick else 60.0)
    if args.flood:
        print(json.dumps(asyncio.run(run_sybils(args.flood, args))))
        return
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
            log(f"coordinator pid {server.pid} on {url}; {args.sybils} Sybil keys for {args.duration_s} s")
            cpu_before_s = cpu_seconds(server.pid)
            result = run(url, args, env)
            result["server_cpu_share"] = round((cpu_seconds(server.pid) - cpu_before_s) / result["elapsed_s"], 2)
            result["server_log_tail"] = server.log_path.read_text()[-500:]
        finally:
            server.stop()
    summary = {
        "sybil_keys": args.sybils,
        "honest_workers": NUM_HONEST,
        "honest_lease_share": result["honest_lease_share"],
        "honest_p99_ms": result["honest"]["heartbeat_p99_ms"],
        "honest_leases": result["honest"]["leases"],
        "sybil_leases": result["sybil"]["leases"],
    }
    print(
        json.dumps(
            {
                "bench": "sybil_bench",
                "sybil_keys": args.sybils,
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
                "result": result,
                "summary": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
