"""Benchmark: one synthetic checkpoint from an origin through 2 relays to 4 clients on loopback.

Three runs over the same bytes and topology, all real processes on 127.0.0.1:

Clients on both sides are started before the clock and have imported what they need; they are
told the version once the relays hold it, as a running worker is when a version is announced.

- **ours**: ``publish_checkpoint`` (called in this process, as the coordinator will; the reference
  broadcasts from its running origin process too) into a store served by ``prime-relay origin``, two
  ``prime-relay serve`` relays mirroring it, four ``prime-relay fetch`` clients downloading
  from both relays (signed manifest, every shard verified, files written in place).
- **reference**: ``shardcast==0.3.2`` in its own venv (``.bench-venv/``, created on first use):
  ``shardcast.initialize`` + ``broadcast`` as the origin, two ``MiddleNode`` relays, four
  ``ClientNode`` clients. Its servers bind 0.0.0.0 and its client uses fixed temp paths, so a
  small wrapper (written next to the run) binds them to 127.0.0.1 and gives each process its
  own temp path and package copy; it also creates the ``data1.bin`` probe file it needs.
  Its relays only serve a version after downloading it whole, so its clients start then.
- **curl**: four ``curl --parallel`` processes fetching every shard of the version from our
  two (already filled) relays, unverified: plain HTTP throughput for scale.

End-to-end time runs from the start of publishing to the last client holding verified bytes.
Prints one JSON object; ``summary.speedup_vs_reference`` is reference / ours end to end,
``summary.speedup_vs_curl`` is curl / ours for the client phase alone (same relays, same bytes),
each taken within a round and then the median over ``--repeat`` rounds (run order alternates).
``cpu_s`` is the CPU time each system used for the job, a figure less swayed by other load.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3

from bench.polling import wait_until
from bench.shardcast_clients import OUR_CLIENT, Processes, start_waiting_clients, tell
from bench.venvs import reference_venv
from runtime.ports import free_port
from shardcast.format.manifest import hash_file

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REFERENCE_VERSION = "0.3.2"
MIB = 1024 * 1024

REFERENCE_WRAPPER = r'''
"""Runs one shardcast 0.3.2 node bound to 127.0.0.1 with per-process temp paths (benchmark harness)."""
import os, sys, threading, time, pathlib
import shardcast.server as srv
import shardcast.client as cli
from shardcast.utils import logger

logger.setLevel("WARNING")


def run_on_loopback(directory, port, shutdown_event=None):
    shutdown_event = shutdown_event or threading.Event()
    server = srv.ShardcastServer(("127.0.0.1", port), directory, shutdown_event)
    thread = threading.Thread(target=srv._server_thread, args=(server, shutdown_event), daemon=True)
    thread.start()
    return server, thread


srv.run_server = run_on_loopback
_RealPath = cli.Path
_probe = os.path.join(os.environ["BENCH_TMP"], "dummy.bin")
cli.Path = lambda p, *rest: _RealPath(_probe) if str(p) == "/tmp/dummy.bin" else _RealPath(p, *rest)

mode = sys.argv[1]
if mode == "origin":
    import shardcast
    data_dir, port, shard_size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    shardcast.initialize(data_dir, port, 5)
    print("ready", flush=True)
    for line in sys.stdin:
        path = line.strip()
        if path:
            print("published", shardcast.broadcast(path, shard_size), flush=True)
elif mode == "middle":
    from shardcast.middle_node import MiddleNode
    upstream, data_dir, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
    MiddleNode([upstream], data_dir, port, check_interval=1)
    print("ready", flush=True)
    while True:
        time.sleep(1)
elif mode == "client":
    from shardcast.client_node import ClientNode
    servers, out_dir, out_file = sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    print("ready", flush=True)
    version = sys.stdin.readline().strip()
    result = ClientNode(servers, out_dir).download_version(version, out_file)
    sys.exit(0 if result else 1)
'''


def process_cpu_s(pid: int) -> float:
    """CPU seconds of a running process and of the children it has reaped (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds one system spends between two points: its running processes (read from /proc),
    the ones reaped meanwhile (their whole use shows in RUSAGE_CHILDREN), and this process's own
    (publishing, for ours). Less sensitive than wall time to what else the machine is running."""

    def __init__(self, procs: Processes) -> None:
        self.procs = procs
        self.start = self._now()

    def _now(self) -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        running = sum(process_cpu_s(proc.pid) for proc in self.procs.procs if proc.returncode is None)
        return children.ru_utime + children.ru_stime + running + time.process_time()

    def elapsed(self) -> float:
        return round(self._now() - self.start, 2)


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def relay_lists(url: str, version: int) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/versions", timeout=2) as response:
            listing = json.load(response)
    except OSError:
        return False
    return any(info["version"] == version for info in listing["versions"])


def make_checkpoint(directory: Path, size_bytes: int, seed: int = 0) -> Path:
    """One file of pseudo-random (incompressible, never repeating) bytes: a single-file checkpoint."""
    directory.mkdir(parents=True)
    path = directory / "model.safetensors"
    with open(path, "wb") as handle:
        for counter, offset in enumerate(range(0, size_bytes, 16 * MIB)):
            stream = blake3.blake3(f"{seed}/{counter}".encode())
            handle.write(stream.digest(length=min(16 * MIB, size_bytes - offset)))
    return path


def run_ours(work: Path, checkpoint_dir: Path, shard_size: int, num_clients: int, durable: bool) -> dict[str, Any]:
    procs = Processes()
    logs = work / "logs"
    logs.mkdir(parents=True)
    key_dir = work / "coordinator"
    from protocol.identity import load_or_create_identity
    from shardcast.format.store import VersionStore
    from shardcast.origin.publish import publish_checkpoint

    coordinator = load_or_create_identity(key_dir)
    coordinator_id = coordinator.node_id
    origin_port, relay_ports = free_port(), [free_port(), free_port()]
    origin_url = f"http://127.0.0.1:{origin_port}"
    relay_urls = [f"http://127.0.0.1:{port}" for port in relay_ports]
    try:
        procs.start(
            [str(BIN / "prime-relay"), "origin", "--store", str(work / "store"), "--port", str(origin_port)],
            logs / "origin.log",
        )
        for index, port in enumerate(relay_ports):
            procs.start(
                [
                    *(str(BIN / "prime-relay"), "serve", "--upstream", origin_url, "--port", str(port)),
                    *("--coordinator-id", coordinator_id, "--data-dir", str(work / f"relay{index}")),
                    *("--set", "poll_interval_s=1.0"),  # as the reference middle nodes (check_interval=1)
                ],
                logs / f"relay{index}.log",
            )
        for url in [origin_url, *relay_urls]:
            wait_until(functools.partial(http_ok, f"{url}/healthz"), 30, f"{url} to start")
        argvs = [
            [
                sys.executable,
                "-c",
                OUR_CLIENT,
                ",".join(relay_urls),
                coordinator_id,
                str(work / f"client{index}"),
                "01"[durable],
            ]
            for index in range(num_clients)
        ]
        clients = start_waiting_clients(procs, argvs, logs)
        store = VersionStore(work / "store")  # the origin process serves what this process publishes
        meter = CpuMeter(procs)
        started = time.monotonic()
        publish_checkpoint(checkpoint_dir, 1, coordinator, store, shard_size_bytes=shard_size, fsync_enabled=durable)
        published = time.monotonic()
        wait_until(lambda: all(relay_lists(url, 1) for url in relay_urls), 60, "relays to list version 1", 0.01)
        listed = time.monotonic()
        tell(clients, "1")
        per_client = []
        for proc in clients:
            out, _ = proc.communicate(timeout=1800)
            per_client.append(time.monotonic() - listed)
            (logs / f"client{len(per_client) - 1}.events").write_bytes(out)
            events = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
            if proc.returncode != 0 or not events or events[-1]["event"] != "done":
                raise RuntimeError(f"our client failed: {events[-1:]}")
        finished = time.monotonic()
        cpu_s = meter.elapsed()
        source = hash_file("blake3", checkpoint_dir / "model.safetensors")
        identical = all(
            hash_file("blake3", work / f"client{i}" / "v1" / "model.safetensors") == source for i in range(num_clients)
        )
        curl = run_curl(work, relay_urls, 1, num_clients, logs)
    finally:
        procs.stop_all()
    timings = stage_times(started, published, listed, finished, per_client)
    timings["relays_listed_s"] = timings.pop("relays_s")
    return {**timings, "cpu_s": cpu_s, "bit_identical": identical, "curl": curl}


def stage_times(
    started: float, published: float, relays_ready: float, finished: float, per_client: list[float]
) -> dict[str, Any]:
    """Seconds spent publishing, until the relays are ready, in the client phase, and in all."""
    return {
        "publish_s": round(published - started, 3),
        "relays_s": round(relays_ready - published, 3),
        "clients_s": round(finished - relays_ready, 3),
        "end_to_end_s": round(finished - started, 3),
        "per_client_s": [round(seconds, 3) for seconds in per_client],
    }


def run_curl(work: Path, relay_urls: list[str], version: int, num_clients: int, logs: Path) -> dict[str, Any]:
    """Plain parallel curl downloads of every shard, round-robin over the relays, no verification."""
    curl = shutil.which("curl")
    if curl is None:
        return {"error": "curl is not installed"}
    with urllib.request.urlopen(f"{relay_urls[0]}/v/{version}/manifest.json", timeout=10) as response:
        manifest = json.load(response)["manifest"]
    num_shards = len(manifest["shards"])
    procs = []
    started = time.monotonic()
    for client in range(num_clients):
        out_dir = work / f"curl{client}"
        out_dir.mkdir()
        argv = [curl, "-s", "--fail", "--parallel", "--parallel-max", "8"]
        for index in range(num_shards):
            url = f"{relay_urls[(index + client) % len(relay_urls)]}/v/{version}/shards/{index}"
            argv += ["-o", str(out_dir / str(index)), url]
        procs.append(subprocess.Popen(argv, stderr=open(logs / f"curl{client}.log", "ab")))  # noqa: SIM115
    codes = [proc.wait(timeout=1800) for proc in procs]
    seconds = time.monotonic() - started
    sizes_ok = all(
        sum(path.stat().st_size for path in (work / f"curl{c}").iterdir()) == manifest["total_size_bytes"]
        for c in range(num_clients)
    )
    return {"clients_s": round(seconds, 3), "all_ok": sizes_ok and codes == [0] * num_clients}


def reference_package(python: Path, work: Path) -> Path:
    """The directory of the shardcast package installed in the reference venv of ``python``."""
    return Path(
        subprocess.run(
            [str(python), "-c", "import shardcast, os; print(os.path.dirname(shardcast.__file__))"],
            check=True,
            capture_output=True,
            text=True,
            cwd=work,
        ).stdout.strip()
    )


def reference_node_env(work: Path, package: Path, name: str) -> dict[str, str]:
    """Reference node ``name``'s environment: its own ``package`` copy (its client keeps temp files there), temp dir."""
    root = work / "nodes" / name
    shutil.copytree(package, root / "pkg" / "shardcast")
    (root / "tmp").mkdir()
    return {
        **os.environ,
        "PYTHONPATH": str(root / "pkg"),
        "BENCH_TMP": str(root / "tmp"),
        "TMPDIR": str(root / "tmp"),
    }


def run_reference(work: Path, python: Path, checkpoint_file: Path, shard_size: int, num_clients: int) -> dict[str, Any]:
    """Time shardcast 0.3.2 broadcasting ``checkpoint_file`` from its origin through 2 middle nodes to the clients."""
    if shutil.which("wget") is None:
        return {"error": "wget is not installed (the reference client shells out to it)"}
    procs = Processes()
    logs = work / "logs"
    logs.mkdir(parents=True)
    wrapper = work / "ref_node.py"
    wrapper.write_text(REFERENCE_WRAPPER)
    node_env = functools.partial(reference_node_env, work, reference_package(python, work))
    probe = os.urandom(10 * 1000 * 1000)
    origin_port, middle_ports = free_port(), [free_port(), free_port()]
    origin_url = f"http://127.0.0.1:{origin_port}"
    middle_urls = [f"http://127.0.0.1:{port}" for port in middle_ports]
    num_shards = -(-checkpoint_file.stat().st_size // shard_size)
    try:
        origin_dir = work / "origin"
        origin_dir.mkdir()
        (origin_dir / "data1.bin").write_bytes(probe)
        origin = procs.start(
            [str(python), str(wrapper), "origin", str(origin_dir), str(origin_port), str(shard_size)],
            logs / "origin.log",
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            env=node_env("origin"),
        )
        assert origin.stdout is not None and origin.stdin is not None
        if origin.stdout.readline().strip() != b"ready":
            raise RuntimeError("reference origin did not start; see its log")
        middle_dirs = []
        for index, port in enumerate(middle_ports):
            middle_dir = work / f"middle{index}"
            middle_dir.mkdir()
            (middle_dir / "data1.bin").write_bytes(probe)
            middle_dirs.append(middle_dir)
            procs.start(
                [str(python), str(wrapper), "middle", origin_url, str(middle_dir), str(port)],
                logs / f"middle{index}.log",
                env=node_env(f"middle{index}"),
            )
        for url in middle_urls:
            wait_until(functools.partial(http_ok, f"{url}/data1.bin"), 60, f"reference middle {url}")
        argvs = [
            [str(python), str(wrapper), "client", ",".join(middle_urls), *client_paths(work, index)]
            for index in range(num_clients)
        ]
        envs = [node_env(f"client{index}") for index in range(num_clients)]
        clients = start_waiting_clients(procs, argvs, logs, envs, cwd=work)
        meter = CpuMeter(procs)
        started = time.monotonic()
        origin.stdin.write(f"{checkpoint_file}\n".encode())
        origin.stdin.flush()
        line = origin.stdout.readline().decode().split()
        if line[:1] != ["published"]:
            raise RuntimeError(f"reference broadcast failed: {line}")
        version = line[1]
        published = time.monotonic()

        def mirrored() -> bool:
            names = [f"shard_{i + 1:05d}.bin" for i in range(num_shards)]
            return all((d / version / name).exists() for d in middle_dirs for name in names)

        wait_until(mirrored, 1800, "reference middle nodes to mirror the version", 0.01)
        listed = time.monotonic()
        tell(clients, version)
        per_client = []
        for proc in clients:
            code = proc.wait(timeout=1800)
            per_client.append(time.monotonic() - listed)
            if code != 0:
                raise RuntimeError(f"reference client failed (exit {code}); see {logs}")
        finished = time.monotonic()
        cpu_s = meter.elapsed()
        source = hash_file("blake3", checkpoint_file)
        identical = all(
            hash_file("blake3", work / f"client{i}" / "model.safetensors") == source for i in range(num_clients)
        )
    finally:
        procs.stop_all()
    timings = stage_times(started, published, listed, finished, per_client)
    timings["relays_mirrored_s"] = timings.pop("relays_s")
    return {"version": REFERENCE_VERSION, **timings, "cpu_s": cpu_s, "bit_identical": identical}


def client_paths(work: Path, index: int) -> tuple[str, str]:
    """The reference client's output directory and reassembled file."""
    return str(work / f"client{index}"), str(work / f"client{index}" / "model.safetensors")


def median_of(rounds: list[dict[str, Any]], system: str, key: str) -> float | None:
    values = [entry[system][key] for entry in rounds if key in entry.get(system, {})]
    return round(statistics.median(values), 3) if values else None


def per_round_ratios(
    rounds: list[dict[str, Any]], numerator: tuple[str, str], denominator: tuple[str, str]
) -> list[float]:
    found = [ratio(entry.get(numerator[0], {}).get(numerator[1]), entry.get(denominator[0], {}).get(denominator[1]))
             for entry in rounds]  # fmt: skip
    return [value for value in found if value is not None]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=1024, help="Checkpoint size (default 1 GiB).")
    parser.add_argument("--shard-size-mib", type=int, default=32, help="Shard size for both systems.")
    parser.add_argument("--clients", type=int, default=4, help="Number of clients.")
    parser.add_argument("--quick", action="store_true", help="64 MiB, 4 MiB shards: done in under a minute.")
    parser.add_argument("--skip-reference", action="store_true", help="Only run ours and curl.")
    parser.add_argument("--bench-venv", type=Path, default=REPO / ".bench-venv", help="Venv for shardcast 0.3.2.")
    parser.add_argument("--workdir", type=Path, default=None, help="Scratch directory (default: a temp dir).")
    parser.add_argument(
        "--durable",
        action="store_true",
        help="Let ours fsync (its default in production); off by default because the reference never fsyncs.",
    )
    parser.add_argument("--repeat", type=int, default=1, help="Rounds (alternating order); figures are medians.")
    parser.add_argument("--keep", action="store_true", help="Keep the scratch directory (logs, events) for a look.")
    args = parser.parse_args(argv)
    size_mib, shard_mib = (64, 4) if args.quick else (args.size_mib, args.shard_size_mib)
    size_bytes, shard_size = size_mib * MIB, shard_mib * MIB
    scratch = Path(tempfile.mkdtemp(prefix="shardcast-bench-", dir=args.workdir))
    result: dict[str, Any] = {
        "bench": "shardcast",
        "size_bytes": size_bytes,
        "shard_size_bytes": shard_size,
        "num_relays": 2,
        "num_clients": args.clients,
        "ours_fsync": args.durable,
        "topology": "origin -> 2 relays (each mirrors the origin) -> clients (each downloads from both relays)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }
    rounds: list[dict[str, Any]] = []
    try:
        log(f"writing a {size_mib} MiB checkpoint")
        checkpoint_dir = scratch / "checkpoint"
        checkpoint_file = make_checkpoint(checkpoint_dir, size_bytes)
        python = (
            None
            if args.skip_reference
            else reference_venv(
                args.bench_venv, "shardcast", REFERENCE_VERSION, [f"shardcast=={REFERENCE_VERSION}"], log
            )
        )
        for number in range(args.repeat):
            # alternate who goes first, so neither always meets the machine in the same state
            order = ["ours", "reference"] if number % 2 == 0 else ["reference", "ours"]
            entry: dict[str, Any] = {}
            for system in order if python is not None else ["ours"]:
                os.sync()  # start with no dirty pages left by the previous run: nobody pays another's writeback
                work = scratch / f"{system}{number}"
                log(f"round {number + 1}/{args.repeat}: running {system}")
                if system == "ours":
                    entry["ours"] = run_ours(work, checkpoint_dir, shard_size, args.clients, args.durable)
                    entry["curl"] = entry["ours"].pop("curl")
                else:
                    assert python is not None
                    try:
                        entry["reference"] = run_reference(work, python, checkpoint_file, shard_size, args.clients)
                    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
                        entry["reference"] = {"error": str(exc)}
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
            rounds.append(entry)
    finally:
        if args.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.repeat == 1:
        result.update(rounds[0])
    else:
        result["rounds"] = rounds
    ours_s = median_of(rounds, "ours", "end_to_end_s")
    reference_s = median_of(rounds, "reference", "end_to_end_s")
    ours_clients_s = median_of(rounds, "ours", "clients_s")
    curl_s = median_of(rounds, "curl", "clients_s")
    ours_cpu_s, reference_cpu_s = median_of(rounds, "ours", "cpu_s"), median_of(rounds, "reference", "cpu_s")
    vs_reference = per_round_ratios(rounds, ("reference", "end_to_end_s"), ("ours", "end_to_end_s"))
    vs_curl = per_round_ratios(rounds, ("curl", "clients_s"), ("ours", "clients_s"))
    cpu = per_round_ratios(rounds, ("reference", "cpu_s"), ("ours", "cpu_s"))
    result["summary"] = {
        "speedup_vs_reference": round(statistics.median(vs_reference), 3) if vs_reference else None,
        "speedup_vs_curl": round(statistics.median(vs_curl), 3) if vs_curl else None,
        "cpu_ratio_reference_over_ours": round(statistics.median(cpu), 3) if cpu else None,
        "speedup_vs_reference_per_round": vs_reference,
        "speedup_vs_curl_per_round": vs_curl,
        "ours_end_to_end_s": ours_s,
        "reference_end_to_end_s": reference_s,
        "ours_clients_s": ours_clients_s,
        "curl_clients_s": curl_s,
        "ours_cpu_s": ours_cpu_s,
        "reference_cpu_s": reference_cpu_s,
        "num_rounds": args.repeat,
        "how": "ratios taken within each round (reference/ours end to end; curl/ours client phase), then the "
        "median over rounds; times are medians over rounds",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
