"""Relays that misbehave on purpose, for integration tests: real HTTP servers on 127.0.0.1 in front of a real relay.

:class:`RelayDouble` reads each request and hands the connection to :meth:`RelayDouble.answer`;
:class:`TricklingRelay` answers with the upstream's response one byte at a time (a slow relay, or a
download that stays in progress for as long as a test needs).
"""

from __future__ import annotations

import socket
import socketserver
import threading
from typing import Self

import httpx


class RelayDouble:
    """A real HTTP server on 127.0.0.1 standing in for a relay in front of ``upstream``: it reads each request and
    hands the connection and path to :meth:`answer`, one thread a connection."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.num_requests = 0
        self.paths: list[str] = []
        """Every path asked for, in order."""
        self.stopping = threading.Event()
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay.serve(self.request)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def serve(self, connection: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = connection.recv(4096)
            if not chunk:
                return
            request += chunk
        self.num_requests += 1
        path = request.split(b" ", 2)[1].decode()
        self.paths.append(path)
        self.answer(connection, path)

    def answer(self, connection: socket.socket, path: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class TricklingRelay(RelayDouble):
    """Answers every request with the upstream's response, one byte a second."""

    def __init__(self, upstream: str, bytes_per_s: float = 1.0, shards_only: bool = False) -> None:
        super().__init__(upstream)
        self.delay_s = 1.0 / bytes_per_s
        self.shards_only = shards_only
        """Answer manifests and listings at full speed: only shard bodies trickle (so hedging must catch it)."""

    def answer(self, connection: socket.socket, path: str) -> None:
        answer = httpx.get(f"{self.upstream}{path}", timeout=10)
        head = f"HTTP/1.1 {answer.status_code} X\r\nContent-Length: {len(answer.content)}\r\nConnection: close\r\n\r\n"
        if self.shards_only and "/shards/" not in path:
            connection.sendall(head.encode() + answer.content)
            return
        for byte in head.encode() + answer.content:
            if self.stopping.wait(self.delay_s):
                return
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                return
