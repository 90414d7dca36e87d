"""The ledger benches' signed-HTTP load client: keep-alive connections, simulated nodes, their latencies.

:class:`Pool` shares a few keep-alive HTTP/1.1 connections (optionally leaving from a given local
address) among many :class:`SimulatedWorker` s, each signing its requests with its own Ed25519 key;
a :class:`Recorder` keeps every endpoint's latencies and errors (:func:`percentile_ms` of them), and
:func:`cpu_seconds` reads what the server under load has spent. Used by bench/ledger_load.py and
bench/sybil_bench.py.

The connections are a minimal keep-alive HTTP/1.1 client over asyncio streams: httpx's per-request
overhead (~2 ms of client CPU) would make the load generator, not the ledger, the bottleneck on a
2-core machine.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import routes
from protocol.identity import NodeIdentity
from protocol.ledger_client import HEADER_SUBMISSION_SIGNATURE
from protocol.schemas import SubmitRequest
from protocol.signing import sign_document, sign_request

ENDPOINTS = ("register", "heartbeat", "lease", "submit", "pending", "verdict")
"""The endpoints a :class:`Recorder` times unless told others (those of the ledger load bench)."""


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
        self.idle: list[Connection | None] = [None] * size  # connected lazily
        self.waiting: collections.deque[asyncio.Future[Connection | None]] = collections.deque()

    async def _take(self) -> Connection | None:
        """The next free connection, first come first served.

        Not an asyncio.Queue: a caller that asks right after giving a connection back (a submit after its
        lease) would take it ahead of the callers already waiting, and a woken waiter that lost that race
        goes to the back of the line, so heartbeats and leases would queue for seconds behind submits.
        """
        if self.idle and not self.waiting:
            return self.idle.pop()
        waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
        self.waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a connection, then cancelled: pass it on
                self._give_back(waiter.result())
            raise

    def _give_back(self, conn: Connection | None) -> None:
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():  # a cancelled waiter is skipped
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    async def request(
        self, method: str, path: str, body: bytes, headers: Callable[[], dict[str, str]]
    ) -> tuple[int, bytes]:
        """Send on the next free connection; ``headers`` is called then (signatures carry a timestamp).

        A kept-alive connection the server closed while it was idle (uvicorn does after 5 s) fails on its
        next request before anything was answered: that request is sent once more on a new connection.
        """
        conn = await self._take()
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
            self._give_back(None)
            raise
        self._give_back(conn)
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
        document = SubmitRequest.model_validate(document).model_dump(mode="json")  # signed with every default
        signature = sign_document(self.identity, document)
        answer = await self.call("submit", routes.SUBMISSIONS, document, {HEADER_SUBMISSION_SIGNATURE: signature})
        return str(answer["submission_id"]) if answer is not None else None

    async def run(self, life: Life, stop_at: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, life.join_at - loop.time()))
        if await self.call("register", routes.NODES_REGISTER, registration("worker")) is None:
            return
        period_s = life.period_s
        end_at = min(stop_at, life.leave_at)
        next_beat = loop.time() + period_s
        next_task = loop.time() + life.rng.uniform(0, period_s)
        while (wake := min(next_beat, next_task)) < end_at:
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
        if life.crashes and life.leave_at < stop_at:  # gone with a lease held: the ledger expires it
            await self.call("lease", routes.LEASES, {"v": 1, "max_tasks": 1, "policy_versions_held": [0]})


@dataclass
class Life:
    """When a simulated worker joins and leaves, how fast it works, and whether it crashes on leaving."""

    join_at: float
    period_s: float
    leave_at: float
    crashes: bool
    rng: random.Random


def percentile_ms(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
