"""Real `prime-relay` processes on 127.0.0.1, for the SHARDCAST integration tests and benches.

Every process is started through :class:`Nodes` and stopped by whoever started it, by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from runtime.children import stop_processes
from runtime.ports import free_port

PRIME_RELAY = str(Path(sys.executable).parent / "prime-relay")


def make_checkpoint(directory: Path, seed: int, size_bytes: int = 3 * 1024 * 1024) -> Path:
    """A small HF-like checkpoint whose bytes depend on ``seed``."""
    (directory / "tokenizer").mkdir(parents=True)
    rng_bytes = _seeded_bytes(seed, size_bytes)
    (directory / "model-00001-of-00002.safetensors").write_bytes(rng_bytes[: size_bytes // 3])
    (directory / "model-00002-of-00002.safetensors").write_bytes(rng_bytes[size_bytes // 3 :])
    (directory / "config.json").write_text(json.dumps({"seed": seed, "hidden_size": 16}))
    (directory / "tokenizer" / "tokenizer.json").write_text(json.dumps({"seed": seed}))
    return directory


def _seeded_bytes(seed: int, size: int) -> bytes:
    import blake3

    return blake3.blake3(str(seed).encode()).digest(length=size)


def header_bomb(raw_bytes: int) -> bytes:
    """A value patch whose header is ``raw_bytes`` of valid JSON (empty objects, the costliest to parse) in a frame
    of a few kilobytes: what a bad publish or a hostile file can hand an applier."""
    import zstandard

    from shardcast.format.patch import ENCODING, MAGIC

    count = (raw_bytes - 60) // 3
    raw = b'{"encoding":"' + ENCODING.encode() + b'","base":[],"files":[' + b"{}," * (count - 1) + b"{}]}"
    params = zstandard.ZstdCompressionParameters(format=zstandard.FORMAT_ZSTD1_MAGICLESS)
    packed = zstandard.ZstdCompressor(compression_params=params).compress(raw)
    return MAGIC + len(packed).to_bytes(8, "little") + len(raw).to_bytes(8, "little") + packed


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Relative path -> content of every checkpoint file (our own dotfiles left out)."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.name.startswith(".")
    }


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def get_json(url: str) -> Any:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def holds(url: str, version: int, complete: bool = True) -> bool:
    listing = get_json(f"{url}/versions")
    if not listing:
        return False
    for info in listing["versions"]:
        if info["version"] == version:
            return not complete or info["num_shards_ready"] == info["num_shards"]
    return False


def metric(url: str, name: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Nodes:
    """Starts `prime-relay` processes; :meth:`stop_all` ends each one by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen([PRIME_RELAY, *argv], stderr=log, stdout=kwargs.pop("stdout", log), **kwargs)
        self.procs.append(proc)
        return proc

    def origin(self, store: Path) -> str:
        port = free_port()
        self._start(f"origin-{port}", ["origin", "--store", str(store), "--port", str(port)])
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: get_json(f"{url}/healthz") is not None, 30, f"origin {url}")
        return url

    def relay(
        self,
        upstreams: list[str],
        coordinator_id: str,
        port: int | None = None,
        data_dir: Path | None = None,
        **settings: Any,
    ) -> tuple[str, subprocess.Popen[bytes]]:
        port = port or free_port()
        argv = ["serve", "--port", str(port), "--coordinator-id", coordinator_id]
        argv += ["--data-dir", str(data_dir or self.root / f"relay-{port}"), "--set", "poll_interval_s=0.2"]
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        for upstream in upstreams:
            argv += ["--upstream", upstream]
        proc = self._start(f"relay-{port}", argv)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: get_json(f"{url}/healthz") is not None, 30, f"relay {url}")
        return url, proc

    def fetch(
        self, version: int | str, relays: list[str], coordinator_id: str, out: Path, *extra: str
    ) -> subprocess.Popen[bytes]:
        argv = ["fetch", str(version), "--coordinator-id", coordinator_id, "--out", str(out), "--json-events"]
        argv += [item for relay in relays for item in ("--relay", relay)]
        argv += ["--no-fsync", *extra]
        return self._start(f"fetch-{len(self.procs)}", argv, stdout=subprocess.PIPE)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_all(self) -> None:
        stop_processes(self.procs, timeout_s=10)


def events_of(proc: subprocess.Popen[bytes], timeout_s: float = 120) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=timeout_s)
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def stream_events(proc: subprocess.Popen[bytes]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            yield json.loads(line)


def corrupt_shard(version_dir: Path, index: int) -> None:
    """Flip one byte inside shard ``index`` of a stored version (origin layout: files under files/)."""
    from protocol.schemas import SignedManifest
    from shardcast.format.manifest import shard_spans

    manifest = SignedManifest.model_validate_json((version_dir / "manifest.json").read_bytes()).manifest
    span = max(shard_spans(manifest, manifest.shards[index]), key=lambda s: s.length)
    with open(version_dir / "files" / span.path, "r+b") as handle:
        handle.seek(span.file_offset + span.length // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))
