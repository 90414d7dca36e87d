"""First contact with relays: a relay that trickles its answer delays a node's start by a bounded time."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from runtime.first_contact import check_relays


@pytest.fixture
def trickling_url() -> Iterator[str]:
    """A real TCP server on 127.0.0.1 that answers any request with an HTTP head, one byte every 0.2 s."""
    server = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stopping.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.recv(4096)
                for byte in b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"v": 1, "versions"':
                    if stopping.wait(0.2):
                        return
                    try:
                        connection.sendall(bytes([byte]))
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stopping.set()
        thread.join(timeout=5)
        server.close()


def test_a_trickling_relay_is_logged_as_slow_within_the_bound(trickling_url: str) -> None:
    started = time.monotonic()
    answers = asyncio.run(check_relays([trickling_url, trickling_url], timeout_s=1.0))
    elapsed = time.monotonic() - started
    assert answers == [False, False]
    assert elapsed < 3.0, f"two slow relays held the check for {elapsed:.1f} s (checked at once, 1 s bound each)"


def test_https_to_a_plain_http_coordinator_is_named_at_once() -> None:
    """A TLS handshake answered in plain HTTP cannot succeed by retrying: one line, no 60 s of retries."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from protocol.errors import StartupError
    from runtime.first_contact import check_coordinator

    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        with pytest.raises(StartupError, match="answers plain HTTP, not HTTPS") as raised:
            asyncio.run(check_coordinator(f"https://127.0.0.1:{server.server_port}", timeout_s=60))
        assert time.monotonic() - started < 10
        assert f"http://127.0.0.1:{server.server_port}" in str(raised.value.fix)
    finally:
        server.shutdown()
        server.server_close()
