"""Load on the ledger: N simulated workers against a real `prime-coordinator start` on 127.0.0.1.

For each backend (SQLite, then PostgreSQL) this starts the coordinator as its own process,
then a load generator as another process (so client-side signing and the server do not share
one interpreter): every simulated worker registers, heartbeats every ``--period-s`` seconds,
and once per period leases a task and submits its rollouts, each request signed with its own
pre-generated Ed25519 key. After ``--duration-s`` it prints ONE JSON object: per backend and
endpoint the request count, p50/p99 latency (as the client saw it, queueing included),
requests/s and errors, and a ``summary`` with the p99 of the slowest endpoint per backend.

The coordinator runs with its per-IP limit raised (all simulated workers share 127.0.0.1);
per-node limits stay at their defaults.

    python -m bench.ledger_load            # 1000 workers, 60 s per backend
    python -m bench.ledger_load --quick    # 200 workers, 15 s per backend
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from environments.base import Environment, Example, Scores
from protocol import routes
from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE
from protocol.signing import sign_document, sign_request
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess

REPO_ROOT = Path(__file__).resolve().parents[1]

ENDPOINTS = ("register", "heartbeat", "lease", "submit")


class BenchEnvironment(Environment):
    """Short deterministic prompts for the bench, served as ``target = "bench.ledger_load:BenchEnvironment"``."""

    name = "bench"

    def example(self, index: int) -> Example:
        return Example(index=index, prompt=f"{index % 5000}+{index % 7}=", answer=str(index % 5000 + index % 7))

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", float(completion.strip() == example.answer))


# ---- load generator (child process) ---------------------------------------------------------------
# A minimal keep-alive HTTP/1.1 client over asyncio streams: httpx's per-request overhead (~2 ms
# of client CPU) would make the generator, not the ledger, the bottleneck on a 2-core machine.


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        status = int((await self.reader.readline()).split(b" ", 2)[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)


class Pool:
    def __init__(self, host: str, port: int, size: int, local_address: str | None = None) -> None:
        """``size`` keep-alive connections to host:port, leaving from ``local_address`` when given."""
        self.host, self.port, self.size = host, port, size
        self.local_addr = None if local_address is None else (local_address, 0)
        self.idle: asyncio.Queue[Connection | None] = asyncio.Queue()
        for _ in range(size):
            self.idle.put_nowait(None)  # connected lazily

    async def request(
        self, method: str, path: str, body: bytes, headers: Callable[[], dict[str, str]]
    ) -> tuple[int, bytes]:
        """Send on the next free connection; ``headers`` is called then (signatures carry a timestamp).

        A kept-alive connection the server closed while it was idle (uvicorn does after 5 s) fails on its
        next request before anything was answered: that request is sent once more on a new connection.
        """
        conn = await self.idle.get()
        try:
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                result = await conn.request(method, path, body, headers())
            except (IndexError, ConnectionError, asyncio.IncompleteReadError):
                if not reused:
                    raise
                conn.writer.close()
                conn = await self._connect()
                result = await conn.request(method, path, body, headers())
        except BaseException:
            if conn is not None:
                conn.writer.close()
            self.idle.put_nowait(None)
            raise
        self.idle.put_nowait(conn)
        return result

    async def _connect(self) -> Connection:
        return Connection(*await asyncio.open_connection(self.host, self.port, local_addr=self.local_addr))


class Recorder:
    def __init__(self, endpoints: Sequence[str] = ENDPOINTS) -> None:
        self.latencies_s: dict[str, list[float]] = {name: [] for name in endpoints}
        self.errors: dict[str, int] = dict.fromkeys(endpoints, 0)
        self.error_kinds: dict[str, int] = {}

    def error(self, endpoint: str, kind: str) -> None:
        self.errors[endpoint] += 1
        key = f"{endpoint}: {kind}"
        self.error_kinds[key] = self.error_kinds.get(key, 0) + 1


def registration(role: str) -> dict[str, Any]:
    """The body of a simulated node's registration."""
    hardware = {"accelerator": "cpu", "num_devices": 1, "memory_bytes": 2**34}
    return {"v": 1, "role": role, "hardware": hardware, "engine": "vllm", "software_version": "bench"}


class SimulatedWorker:
    def __init__(self, identity: NodeIdentity, pool: Pool, recorder: Recorder) -> None:
        self.identity = identity
        self.pool = pool
        self.recorder = recorder

    async def call(
        self,
        endpoint: str,
        path: str,
        document: dict[str, Any] | None,
        extra: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """POST ``document`` signed to ``path`` (GET when it is None); the answer, or None on an error (counted)."""
        method = "GET" if document is None else "POST"
        body = b"" if document is None else json.dumps(document).encode()

        def headers() -> dict[str, str]:
            signed = sign_request(self.identity, method, path, body)
            return {"Content-Type": "application/json", **signed, **(extra or {})}

        started = time.perf_counter()
        try:
            status, answer = await self.pool.request(method, path, body, headers)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            self.recorder.error(endpoint, type(exc).__name__)
            return None
        elapsed_s = time.perf_counter() - started
        if status >= 400:
            self.recorder.error(endpoint, f"{status} {json.loads(answer).get('error', '?') if answer else ''}")
            return None
        self.recorder.latencies_s[endpoint].append(elapsed_s)
        result: dict[str, Any] = json.loads(answer)
        return result

    async def submit(self, task: dict[str, Any]) -> str | None:
        """Submit a made-up group for ``task``; its submission id, or None when it was refused (counted)."""
        rollouts = [
            {
                "v": 1,  # the submission signature covers the full wire form, defaults included
                "prompt_index": prompt["prompt_index"],
                "sample_index": sample,
                "completion_ids": [7] * 16,
                "logprobs": [-1.0] * 16,
                "finish_reason": "length",
                "proof_b64": "QUJD" * 8,
            }
            for prompt in task["prompts"]
            for sample in range(task["group_size"])
        ]
        document = {
            "v": 1,
            "lease_id": task["lease_id"],
            "task_id": task["task_id"],
            "policy_version": task["policy_version"],
            "engine": "vllm",
            "rollouts": rollouts,
        }
        signature = sign_document(self.identity, document)
        answer = await self.call("submit", routes.SUBMISSIONS, document, {HEADER_SUBMISSION_SIGNATURE: signature})
        return str(answer["submission_id"]) if answer is not None else None

    async def run(self, stop_at: float, period_s: float, rng: random.Random) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(rng.uniform(0, period_s))  # workers join spread over one period
        if await self.call("register", routes.NODES_REGISTER, registration("worker")) is None:
            return
        next_beat = loop.time() + period_s
        next_task = loop.time() + rng.uniform(0, period_s)
        while (wake := min(next_beat, next_task)) < stop_at:
            await asyncio.sleep(max(0.0, wake - loop.time()))
            if loop.time() >= next_beat:
                beat = {"v": 1, "policy_versions_held": [0], "engine": "vllm", "tokens_per_s": 100.0}
                await self.call("heartbeat", routes.NODES_HEARTBEAT, beat)
                next_beat = max(next_beat + period_s, loop.time())  # a late worker skips, it does not burst
            if loop.time() >= next_task:
                leased = await self.call("lease", routes.LEASES, {"v": 1, "max_tasks": 1, "policy_versions_held": [0]})
                for task in leased["tasks"] if leased else []:
                    await self.submit(task)
                next_task = max(next_task + period_s, loop.time())


async def generate_load(
    url: str, num_workers: int, duration_s: float, period_s: float, num_connections: int, seed: int
) -> dict[str, Any]:
    identities = [NodeIdentity.generate() for _ in range(num_workers)]  # before the clock starts
    host, port = url.removeprefix("http://").rsplit(":", 1)
    recorder = Recorder()
    pool = Pool(host, int(port), num_connections)
    rng = random.Random(seed)
    started = time.perf_counter()
    stop_at = asyncio.get_running_loop().time() + duration_s
    await asyncio.gather(*(SimulatedWorker(i, pool, recorder).run(stop_at, period_s, rng) for i in identities))
    elapsed_s = time.perf_counter() - started
    return {
        "elapsed_s": elapsed_s,
        "latencies_s": recorder.latencies_s,
        "errors": recorder.errors,
        "error_kinds": recorder.error_kinds,
    }


# ---- orchestration (parent process) -----------------------------------------------------------------


def percentile_ms(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 2)


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[ledger_load] {message}", file=sys.stderr, flush=True)


def run_backend(backend: str, ledger_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": f"bench-{backend}",
        "data_dir": str(workdir / backend),
        "environment": {"type": "python", "target": "bench.ledger_load:BenchEnvironment"},
        "api": {"host": "127.0.0.1", "port": port, "ip_rate_per_s": 1e6, "ip_burst": 1_000_000},
        "ledger": {"url": ledger_url},
        "scheduling": {"prompts_per_task": 2, "group_size": 2, "max_tokens": 16, "lease_ttl_s": 600},
        # the simulated workers stand for distinct machines but all connect from loopback: without this,
        # the Sybil defences would treat them as one source and cap their registrations (docs/sybil.md)
        "sources": {"allow": ["127.0.0.0/8"]},
    }
    config_path = workdir / f"{backend}.toml"
    config_path.write_text(tomli_w.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    server = CoordinatorProcess(config_path, workdir / f"{backend}.log", env)
    try:
        server.start(url, ("--log-level", "warning"))
        log(f"{backend}: coordinator pid {server.pid} on {url}; {args.workers} workers for {args.duration_s} s")
        generator = [sys.executable, "-m", "bench.ledger_load", "--generate", url]
        generator += ["--workers", str(args.workers), "--duration-s", str(args.duration_s)]
        generator += ["--period-s", str(args.period_s), "--connections", str(args.connections)]
        server_cpu_before_s = cpu_seconds(server.pid)
        done = subprocess.run(generator, capture_output=True, text=True, env=env, check=False)
        server_cpu_s = cpu_seconds(server.pid) - server_cpu_before_s
        if done.returncode != 0:
            raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
        result = summarize(json.loads(done.stdout))
        # Machine-independent-ish capacity figure: the coordinator's own CPU per request served
        # (PostgreSQL's backend processes are not included).
        result["server_cpu_s"] = round(server_cpu_s, 1)
        result["server_cpu_ms_per_request"] = round(1000 * server_cpu_s / max(1, result["requests"]), 2)
        result["server_cpu_share"] = round(server_cpu_s / result["elapsed_s"], 2)
        result["load_average_1m_after"] = os.getloadavg()[0]
        result["server_side"] = server_side_latency(httpx.get(f"{url}/metrics", timeout=30).text)
        result["server_log_tail"] = server.log_path.read_text()[-500:]
        return result
    finally:
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 workers, 15 s per backend (under a minute)")
    parser.add_argument("--workers", type=int, default=None, help="simulated workers (default 1000; quick 200)")
    parser.add_argument("--duration-s", type=float, default=None, help="seconds of load per backend (60; quick 15)")
    parser.add_argument("--period-s", type=float, default=10.0, help="heartbeat and task period per worker")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections the workers share")
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("PRIME_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL server (a scratch database is created on it and dropped)",
    )
    parser.add_argument("--generate", metavar="URL", help=argparse.SUPPRESS)  # child mode: the load generator
    args = parser.parse_args(argv)
    args.workers = args.workers or (200 if args.quick else 1000)
    args.duration_s = args.duration_s or (15.0 if args.quick else 60.0)
    if args.generate:
        raw = asyncio.run(
            generate_load(args.generate, args.workers, args.duration_s, args.period_s, args.connections, seed=1)
        )
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
    summary: dict[str, Any] = {"workers": args.workers}
    for backend in ("sqlite", "postgresql"):
        summary[f"{backend}_p99_ms"] = results.get(backend, {}).get("slowest_p99_ms")
        summary[f"{backend}_errors"] = results.get(backend, {}).get("errors")
    print(
        json.dumps(
            {
                "bench": "ledger_load",
                "workers": args.workers,
                "duration_s_per_backend": args.duration_s,
                "period_s": args.period_s,
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
