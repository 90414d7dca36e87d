"""Load on the ledger: N simulated workers and validators against a real `prime-coordinator start` on 127.0.0.1.

For each backend (SQLite, then PostgreSQL) this starts the coordinator as its own process
(with ``--replicas 2``, PostgreSQL only: the coordinator and two `--api-only` replicas behind
Debian's HAProxy with deploy/haproxy.cfg), then a load generator as another process (so
client-side signing and the server do not share one interpreter). Every simulated worker
registers, heartbeats once per its period, and once per period leases a task and submits its
rollouts, each request signed with its own pre-generated Ed25519 key. Workers are heterogeneous
(each one's period is ``--period-s`` divided by a log-normal speed factor of mean 1, 0.25x to 4x) and churn
(``--churn``: that share of them leaves during the run, half of them crashing with a lease
held, and as many new ones join). Simulated validators (``--validators``; by default one per 10
submissions a second, so that none outruns the per-node rate limit) ask for the pending
submissions every second and post a verdict on each. After ``--duration-s`` it prints ONE JSON object: per
backend and endpoint the request count, p50/p99 latency (as the client saw it, queueing
included), requests/s and errors, and a ``summary`` with the p99 of the slowest endpoint per
backend (``p99_ms_10k`` too when there are 10,000 workers).

The coordinator runs with its per-IP limit raised (all simulated workers share 127.0.0.1);
per-node limits stay at their defaults.

    python -m bench.ledger_load            # 1000 workers, 60 s per backend
    python -m bench.ledger_load --quick    # 200 workers, 15 s per backend
    python -m bench.ledger_load --backends postgresql --workers 10000 --period-s 60 --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from bench.load_client import (
    ENDPOINTS,
    Life,
    Pool,
    Recorder,
    SimulatedWorker,
    cpu_seconds,
    percentile_ms,
    registration,
)
from environments.base import Environment, Example, Scores
from protocol import routes
from protocol.identity import NodeIdentity
from runtime.children import stop_processes
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.load_balancer import start_haproxy

REPO_ROOT = Path(__file__).resolve().parents[1]

VALIDATOR_PERIOD_S = 1.0
"""How often each simulated validator asks for pending submissions."""


class BenchEnvironment(Environment):
    """Short deterministic prompts for the bench, served as ``target = "bench.ledger_load:BenchEnvironment"``."""

    name = "bench"

    def example(self, index: int) -> Example:
        return Example(index=index, prompt=f"{index % 5000}+{index % 7}=", answer=str(index % 5000 + index % 7))

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", float(completion.strip() == example.answer))


# ---- load generator (child process) ---------------------------------------------------------------


def lives(num_workers: int, period_s: float, churn: float, start: float, duration_s: float, seed: int) -> list[Life]:
    """``num_workers`` joining over the first period, then ``churn`` x that many leaving during the run (half of them
    crashing) and as many joining; each works at its own speed (a log-normal factor of mean 1, 0.25x-4x, dividing
    ``period_s``)."""
    rng = random.Random(seed)
    stop_at = start + duration_s
    num_churning = round(churn * num_workers)
    found = []
    for index in range(num_workers + num_churning):
        speed = min(4.0, max(0.25, rng.lognormvariate(-0.245, 0.7)))  # mean 1: period_s is the mean period
        own_period_s = period_s / speed
        joins_late = index >= num_workers
        join_at = start + (rng.uniform(period_s, duration_s) if joins_late else rng.uniform(0, period_s))
        leaves = index < num_churning
        leave_at = rng.uniform(join_at, stop_at) if leaves else float("inf")
        found.append(Life(join_at, own_period_s, leave_at, leaves and index % 2 == 0, random.Random(rng.random())))
    return found


class SimulatedValidator:
    """A validator that asks for pending submissions once per period and accepts each (the ledger's side of
    auditing). Plain requests, not long-polls, so their latencies are the ledger's and not a wait."""

    def __init__(self, worker: SimulatedWorker) -> None:
        self.node = worker

    async def run(self, stop_at: float) -> None:
        loop = asyncio.get_running_loop()
        if await self.node.call("register", routes.NODES_REGISTER, registration("validator")) is None:
            return
        path = f"{routes.SUBMISSIONS_PENDING}?limit=16"
        while loop.time() < stop_at:
            asked_at = loop.time()
            pending = await self.node.call("pending", path, None)
            for item in pending["submissions"] if pending else []:
                rollouts = item["submission"]["rollouts"]
                verdict = {"v": 1, "submission_id": item["submission_id"], "accepted": True}
                verdict["rewards"] = [0.0] * len(rollouts)
                verdict["reward_components"] = {"exact_match": [0.0] * len(rollouts)}
                await self.node.call("verdict", routes.VERDICTS, verdict)
            await asyncio.sleep(max(0.0, asked_at + VALIDATOR_PERIOD_S - loop.time()))


async def generate_load(url: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    num_lives = args.workers + round(args.churn * args.workers)
    identities = [NodeIdentity.generate() for _ in range(num_lives + args.validators)]  # before the clock starts
    host, port = url.removeprefix("http://").rsplit(":", 1)
    recorder = Recorder()
    pool = Pool(host, int(port), args.connections)
    validator_pool = Pool(host, int(port), max(1, args.validators))
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    stop_at = loop.time() + args.duration_s
    plan = lives(args.workers, args.period_s, args.churn, loop.time(), args.duration_s, seed)
    workers = [SimulatedWorker(identity, pool, recorder) for identity in identities[:num_lives]]
    validators = [SimulatedValidator(SimulatedWorker(i, validator_pool, recorder)) for i in identities[num_lives:]]
    await asyncio.gather(
        *(worker.run(life, stop_at) for worker, life in zip(workers, plan, strict=True)),
        *(validator.run(stop_at) for validator in validators),
    )
    elapsed_s = time.perf_counter() - started
    return {
        "elapsed_s": elapsed_s,
        "latencies_s": recorder.latencies_s,
        "errors": recorder.errors,
        "error_kinds": recorder.error_kinds,
    }


# ---- orchestration (parent process) -----------------------------------------------------------------


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    elapsed_s = raw["elapsed_s"]
    endpoints = {}
    for name in ENDPOINTS:
        latencies = raw["latencies_s"][name]
        endpoints[name] = {
            "count": len(latencies),
            "errors": raw["errors"][name],
            "p50_ms": percentile_ms(latencies, 0.50),
            "p99_ms": percentile_ms(latencies, 0.99),
            "requests_per_s": round(len(latencies) / elapsed_s, 1),
        }
    num_requests = sum(len(values) for values in raw["latencies_s"].values())
    p99s = [entry["p99_ms"] for entry in endpoints.values() if entry["p99_ms"] is not None]
    return {
        "elapsed_s": round(elapsed_s, 1),
        "requests": num_requests,
        "requests_per_s": round(num_requests / elapsed_s, 1),
        "errors": sum(raw["errors"].values()),
        "error_kinds": raw["error_kinds"],
        "slowest_p99_ms": max(p99s) if p99s else None,
        "endpoints": endpoints,
    }


ROUTES = {
    "register": routes.NODES_REGISTER,
    "heartbeat": routes.NODES_HEARTBEAT,
    "lease": routes.LEASES,
    "submit": routes.SUBMISSIONS,
    "pending": routes.SUBMISSIONS_PENDING,
    "verdict": routes.VERDICTS,
}


def server_side_latency(metrics_text: str) -> dict[str, dict[str, float | None]]:
    """Per endpoint, the bucket bounds holding the server's own p50/p99 (from its Prometheus histogram).

    The client-side figures include queueing in the client and the kernel; these do not.
    """
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "prime_ledger_request_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.setdefault(sample.labels["route"], []).append((float(sample.labels["le"]), sample.value))
    found: dict[str, dict[str, float | None]] = {}
    for endpoint, route in ROUTES.items():
        cumulative = sorted(buckets.get(route, []))
        total = cumulative[-1][1] if cumulative else 0.0

        def bound(
            fraction: float, cumulative: list[tuple[float, float]] = cumulative, total: float = total
        ) -> float | None:
            for upper_s, count in cumulative:
                if total and count >= fraction * total:
                    return None if upper_s == float("inf") else upper_s * 1000
            return None

        found[endpoint] = {"count": total, "p50_ms_at_most": bound(0.50), "p99_ms_at_most": bound(0.99)}
    return found


def log(message: str) -> None:
    print(f"[ledger_load] {message}", file=sys.stderr, flush=True)


def run_backend(backend: str, ledger_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    ports = [free_port() for _ in range(1 + args.replicas + (1 if args.replicas else 0))]
    config = {
        "run_name": f"bench-{backend}",
        "data_dir": str(workdir / backend),
        "environment": {"type": "python", "target": "bench.ledger_load:BenchEnvironment"},
        "api": {"host": "127.0.0.1", "port": ports[0], "ip_rate_per_s": 1e6, "ip_burst": 1_000_000},
        "ledger": {"url": ledger_url},
        "scheduling": {"prompts_per_task": 2, "group_size": 2, "max_tokens": 16, "lease_ttl_s": 600},
        "trust": {"validators_open": True},
        "validation": {"hand_out_claim_s": 120.0},  # the validators split the pending list
        # the simulated workers stand for distinct machines but all connect from loopback: without this,
        # the Sybil defences would treat them as one source and cap their registrations (docs/sybil.md)
        "sources": {"allow": ["127.0.0.0/8"], "trusted_proxies": ["127.0.0.1"] if args.replicas else []},
    }
    config_path = workdir / f"{backend}.toml"
    config_path.write_text(tomli_w.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    servers = [CoordinatorProcess(config_path, workdir / f"{backend}-{i}.log", env) for i in range(1 + args.replicas)]
    balancer: subprocess.Popen[bytes] | None = None
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        servers[0].start(urls[0], ("--log-level", "warning"))
        for index, server in enumerate(servers[1:], start=1):
            server.start(urls[index], ("--api-only", "--port", str(ports[index]), "--log-level", "warning"))
        url = urls[0]
        if args.replicas:
            if args.replicas != 2:
                raise ValueError("deploy/haproxy.cfg balances the coordinator and two replicas: --replicas 0 or 2")
            addresses = [u.removeprefix("http://") for u in urls]
            balancer = start_haproxy(addresses[3], addresses[0], (addresses[1], addresses[2]), workdir / "haproxy.log")
            url = urls[3]
        pids = [server.pid for server in servers]
        log(f"{backend}: API pid(s) {pids} behind {url}; {args.workers} workers for {args.duration_s} s")
        generator = [sys.executable, "-m", "bench.ledger_load", "--generate", url]
        generator += ["--workers", str(args.workers), "--duration-s", str(args.duration_s)]
        generator += ["--period-s", str(args.period_s), "--connections", str(args.connections)]
        generator += ["--churn", str(args.churn), "--validators", str(args.validators)]
        server_cpu_before_s = sum(cpu_seconds(pid) for pid in pids)
        balancer_cpu_before_s = cpu_seconds(balancer.pid) if balancer else 0.0
        done = subprocess.run(generator, capture_output=True, text=True, env=env, check=False)
        server_cpu_s = sum(cpu_seconds(pid) for pid in pids) - server_cpu_before_s
        if done.returncode != 0:
            raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
        result = summarize(json.loads(done.stdout))
        result["api_processes"] = len(servers)
        # Machine-independent-ish capacity figure: the API processes' own CPU per request served
        # (PostgreSQL's backend processes are not included).
        result["server_cpu_s"] = round(server_cpu_s, 1)
        result["server_cpu_ms_per_request"] = round(1000 * server_cpu_s / max(1, result["requests"]), 2)
        result["server_cpu_share"] = round(server_cpu_s / result["elapsed_s"], 2)
        if balancer is not None:
            result["balancer_cpu_s"] = round(cpu_seconds(balancer.pid) - balancer_cpu_before_s, 1)
        result["load_average_1m_after"] = os.getloadavg()[0]
        result["server_side"] = server_side_latency(httpx.get(f"{urls[0]}/metrics", timeout=30).text)
        result["server_log_tail"] = servers[0].log_path.read_text()[-500:]
        return result
    finally:
        if balancer is not None:
            stop_processes([balancer], timeout_s=10)
        for server in reversed(servers):
            server.stop()


def run_postgresql(server_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"prime_ledger_bench_{os.getpid()}_{random.randrange(1 << 30)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        return run_backend("postgresql", url, args, workdir)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def default_validators(num_workers: int, period_s: float) -> int:
    """Validators for ``num_workers`` submitting once per ``period_s`` on average: each posting about 10 verdicts a
    second, half the default per-node rate limit (``api.node_rate_per_s``), so none is refused for its pace."""
    return max(4, math.ceil(num_workers / period_s / 10.0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 workers, 15 s per backend (under a minute)")
    parser.add_argument("--workers", type=int, default=None, help="simulated workers (default 1000; quick 200)")
    parser.add_argument("--duration-s", type=float, default=None, help="seconds of load per backend (60; quick 15)")
    parser.add_argument("--period-s", type=float, default=10.0, help="heartbeat and task period per worker")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections the workers share")
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--churn", type=float, default=0.1, help="share of workers that leave (and join) mid-run")
    parser.add_argument(
        "--validators",
        type=int,
        default=None,
        help="simulated validators polling the pending list (default: one per 10 submissions a second, at least 4)",
    )
    parser.add_argument(
        "--replicas", type=int, default=0, choices=(0, 2), help="API replicas beside the coordinator (PostgreSQL)"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("PRIME_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL server (a scratch database is created on it and dropped)",
    )
    parser.add_argument("--generate", metavar="URL", help=argparse.SUPPRESS)  # child mode: the load generator
    args = parser.parse_args(argv)
    if args.replicas and "sqlite" in args.backends.split(","):
        parser.error("API replicas share a PostgreSQL ledger: give --backends postgresql with --replicas")
    args.workers = args.workers or (200 if args.quick else 1000)
    args.duration_s = args.duration_s or (15.0 if args.quick else 60.0)
    args.validators = args.validators or default_validators(args.workers, args.period_s)
    if args.generate:
        raw = asyncio.run(generate_load(args.generate, args, seed=1))
        print(json.dumps(raw))
        return
    runners: dict[str, Callable[[Path], dict[str, Any]]] = {
        "sqlite": lambda workdir: run_backend("sqlite", "", args, workdir),
        "postgresql": lambda workdir: run_postgresql(args.postgres_url, args, workdir),
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ledger-load-") as tmp:
        for backend in args.backends.split(","):
            try:
                results[backend] = runners[backend](Path(tmp))
            except Exception as exc:  # report the failure in the figures rather than lose the other backend
                results[backend] = {"failed": f"{type(exc).__name__}: {exc}"}
    summary: dict[str, Any] = {"workers": args.workers, "replicas": args.replicas}
    for backend in ("sqlite", "postgresql"):
        summary[f"{backend}_p99_ms"] = results.get(backend, {}).get("slowest_p99_ms")
        summary[f"{backend}_errors"] = results.get(backend, {}).get("errors")
    if args.workers == 10_000 and "postgresql" in results:
        summary["p99_ms_10k"] = summary["postgresql_p99_ms"]
        summary["errors"] = summary["postgresql_errors"]
    print(
        json.dumps(
            {
                "bench": "ledger_load",
                "workers": args.workers,
                "duration_s_per_backend": args.duration_s,
                "period_s": args.period_s,
                "churn": args.churn,
                "validators": args.validators,
                "replicas": args.replicas,
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "backends": results,
                "summary": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
