"""SHARDCAST under faults, with real processes: slow relays, full disks, versions hidden, publishes cut short.

- A relay that trickles one byte a second, listed next to a healthy origin, costs a client
  (and a relay mirroring from both) a few seconds, and is demoted.
- A full disk (a real 1 MiB tmpfs) stops a download at once with the local fault named,
  never retried as a relay's failure; a relay on a full disk says so once and keeps serving.
- `prime-relay fetch latest` never moves a node to a version older than one it holds or saw signed.
- `prime-coordinator publish` never calls a version published from a checkpoint it does not hold,
  and cleans up what a killed publish left in staging; finishing a killed publish announces the version.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from protocol.identity import NodeIdentity, load_or_create_identity
from shardcast.format.store import VersionStore
from shardcast.origin.publish import OriginSource, publish_checkpoint
from tests.support.relay_doubles import RelayDouble, TricklingRelay
from tests.support.shardcast_nodes import (
    Nodes,
    events_of,
    holds,
    make_checkpoint,
    tree_bytes,
    wait_until,
)

pytestmark = pytest.mark.slow
SHARD = 256 * 1024
BIN = Path(sys.executable).parent


def publish(tmp_path: Path, store: Path, signer: NodeIdentity, version: int, size_bytes: int = 3 * 1024 * 1024) -> Path:
    checkpoint = make_checkpoint(tmp_path / f"ckpt{version}", seed=version, size_bytes=size_bytes)
    publish_checkpoint(checkpoint, version, signer, VersionStore(store), shard_size_bytes=SHARD, keep_versions=3)
    return checkpoint


class FaultyRelay(RelayDouble):
    """Passes the upstream's listings and manifests through and breaks every shard:

    ``truncate`` declares the shard's whole length and closes halfway, ``shorten`` declares and sends half,
    ``busy`` answers every shard request 503 forever (a relay that never gets the version's shards).
    """

    def __init__(self, upstream: str, mode: str) -> None:
        super().__init__(upstream)
        self.mode = mode

    def answer(self, connection: socket.socket, path: str) -> None:
        if self.mode == "busy" and "/shards/" in path:
            connection.sendall(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        body = httpx.get(f"{self.upstream}{path}", timeout=10).content
        declared = len(body)
        if "/shards/" in path:
            body = body[: len(body) // 2]
            declared = len(body) if self.mode == "shorten" else declared
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
        with contextlib.suppress(OSError):
            connection.sendall(head.encode() + body)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, tiny filesystem (root only: mount -t tmpfs), unmounted in any case."""
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def timed_fetch(nodes: Nodes, *args: object, timeout_s: float = 60) -> tuple[list[dict[str, object]], float, int]:
    started = time.monotonic()
    proc = nodes.fetch(*args)  # type: ignore[arg-type]
    events = events_of(proc, timeout_s)
    return events, time.monotonic() - started, proc.returncode


def test_a_one_byte_per_second_relay_next_to_a_healthy_origin_costs_seconds(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    checkpoint = publish(tmp_path, tmp_path / "store", coordinator, 1)
    origin = nodes.origin(tmp_path / "store")
    alone_events, alone, code = timed_fetch(nodes, 1, [origin], coordinator.node_id, tmp_path / "alone")
    assert code == 0
    print(f"origin alone: {alone:.2f} s wall ({alone_events[-1]['seconds']} s downloading)")
    cases = (("client", "1", False), ("latest", "latest", False), ("shards", "1", True))
    for name, version, shards_only in cases:
        with TricklingRelay(origin, shards_only=shards_only) as slow:
            events, seconds, code = timed_fetch(
                nodes, version, [slow.url, origin], coordinator.node_id, tmp_path / name, "--parallel", "4"
            )
            done = events[-1]
            print(
                f"{name}: {seconds:.2f} s wall ({done.get('seconds')} s downloading) with the slow relay listed "
                f"first; {alone:.2f} s wall from the origin alone"
            )
            assert code == 0 and done["event"] == "done", events[-3:]
            # wall time includes starting the interpreter (seconds on a loaded 2-core machine)
            assert seconds < 15 and float(done["seconds"]) < 8, f"the slow relay cost {seconds:.1f} s"  # type: ignore[arg-type]
            assert tree_bytes(tmp_path / name / "v1") == tree_bytes(checkpoint)
            assert all(e["source"] == origin for e in events if e["event"] == "shard_done")
            assert slow.num_requests >= 1  # it was asked (first in line), and lost
            relays = {r["url"]: r for r in events[-1]["relays"]}  # type: ignore[attr-defined]
            assert relays[slow.url]["num_failures"] >= 1 and relays[slow.url]["throughput_bps"] < 1000


def test_a_relay_mirrors_past_a_one_byte_per_second_upstream(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    publish(tmp_path, tmp_path / "store", coordinator, 1)
    origin = nodes.origin(tmp_path / "store")
    with TricklingRelay(origin) as slow:
        started = time.monotonic()
        relay, _ = nodes.relay([slow.url, origin], coordinator.node_id)
        wait_until(lambda: holds(relay, 1), 20, "the relay to mirror version 1 past the slow upstream")
        print(f"relay mirrored v1 in {time.monotonic() - started:.2f} s next to a 1 B/s upstream")


def test_a_full_disk_stops_the_download_at_once_and_says_what_to_do(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    publish(tmp_path, tmp_path / "store", coordinator, 1)
    origin = nodes.origin(tmp_path / "store")
    with tmpfs(tmp_path / "disk", "1m") as disk:
        events, seconds, code = timed_fetch(nodes, 1, [origin], coordinator.node_id, disk / "out")
        assert code == 1, events[-3:]
        assert events[-1]["event"] == "error" and events[-1]["error"] == "local_fault", events[-1]
        detail = str(events[-1]["detail"])
        print(f"full disk: exit {code} after {seconds:.2f} s: {detail}")
        assert "No space left on device" in detail and "free space" in detail, detail
        assert not [e for e in events if e["event"] in ("shard_failed", "shard_retry")]  # nothing blamed on a relay
        assert seconds < 10
        assert not (disk / "out" / "v1").exists()
        # the human form: one line, non-zero exit
        argv = [str(BIN / "prime-relay"), "fetch", "1", "--relay", origin, "--coordinator-id", coordinator.node_id]
        human = subprocess.run([*argv, "--out", str(disk / "out2"), "--no-fsync"], capture_output=True, timeout=60)
        message = " ".join(human.stderr.decode().split())  # the console wraps long lines
        assert human.returncode == 1 and "No space left on device" in message and "Traceback" not in message


def test_a_relay_on_a_full_disk_says_so_once_and_keeps_serving(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    checkpoint = publish(tmp_path, tmp_path / "store", coordinator, 1)
    origin = nodes.origin(tmp_path / "store")
    with tmpfs(tmp_path / "disk", "1m") as disk:
        relay, proc = nodes.relay([origin], coordinator.node_id, data_dir=disk / "relay", shard_wait_s=0.2)
        log = tmp_path / f"relay-{relay.rsplit(':', 1)[1]}.log"
        wait_until(lambda: b"mirroring paused" in log.read_bytes(), 30, "the relay to report the full disk")
        time.sleep(2)  # ten polls later: still one report, not one per poll
        lines = [line for line in log.read_text().splitlines() if "No space left" in line]
        assert len(lines) == 1 and "free space" in lines[0], lines
        assert proc.poll() is None
        listing = httpx.get(f"{relay}/versions", timeout=5).json()["versions"][0]
        assert 0 < listing["num_shards_ready"] < listing["num_shards"]
        files = json.loads(httpx.get(f"{relay}/v/1/manifest.json", timeout=5).content)["manifest"]["files"]
        concatenated = b"".join((checkpoint / entry["path"]).read_bytes() for entry in files)
        for index in range(listing["num_shards"]):  # what it serves is right; what it lacks is 503, never garbage
            response = httpx.get(f"{relay}/v/1/shards/{index}", timeout=10)
            assert response.status_code in (200, 503)
            if response.status_code == 200:
                assert response.content == concatenated[index * SHARD : (index + 1) * SHARD]
        nodes.stop(proc)


def test_fetch_latest_never_goes_back_to_an_older_version(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    publish(tmp_path, tmp_path / "store", coordinator, 1, size_bytes=512 * 1024)
    publish(tmp_path, tmp_path / "store", coordinator, 2, size_bytes=512 * 1024)
    origin = nodes.origin(tmp_path / "store")
    hiding_store = tmp_path / "hiding-store"  # a relay that hides v2: it serves only the (genuine) v1
    shutil.copytree(tmp_path / "store" / "v1", hiding_store / "v1")
    hider = nodes.origin(hiding_store)
    out = tmp_path / "node"
    events, _, code = timed_fetch(nodes, "latest", [origin], coordinator.node_id, out)
    assert code == 0 and events[-1]["path"] == str(out / "v2")

    events, _, code = timed_fetch(nodes, "latest", [hider], coordinator.node_id, out)
    assert code == 0, events[-3:]
    assert events[-1]["event"] == "done" and events[-1]["path"] == str(out / "v2")
    assert any(e["event"] == "relays_behind" and e["listed"] == 1 and e["held"] == 2 for e in events)
    assert not (out / "v1").exists()

    # seen signed but not held (deleted since): still never v1; the hidden v2 is asked for and not found
    from shardcast.client.download import NEWEST_SEEN_NAME

    shutil.rmtree(out / "v2")
    assert (out / NEWEST_SEEN_NAME).is_file()
    events, _, code = timed_fetch(nodes, "latest", [hider], coordinator.node_id, out)
    assert code == 1 and events[-1]["error"] == "not_found", events[-3:]
    assert not (out / "v1").exists()


def coordinator_publish(checkpoint: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "prime-coordinator"), "publish", str(checkpoint), "--data-dir", str(run_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})


def test_publish_never_names_a_version_after_a_checkpoint_it_does_not_hold(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = coordinator_publish(make_checkpoint(tmp_path / "Z", seed=0, size_bytes=64 * 1024), run_dir)
    assert first.returncode == 0, first.stderr
    a = make_checkpoint(tmp_path / "A", seed=1, size_bytes=64 * 1024)
    b = make_checkpoint(tmp_path / "B", seed=2, size_bytes=64 * 1024)
    # `publish A` killed after the origin store installed v1, before the ledger made it current;
    # and another publish killed mid-write, leaving its staging folder
    store = VersionStore(run_dir / "policies")
    publish_checkpoint(a, 1, load_or_create_identity(run_dir), store, shard_size_bytes=SHARD)
    leftover = store.staging / "v9-killed"
    (leftover / "files").mkdir(parents=True)
    (leftover / "files" / "model.safetensors").write_bytes(b"x" * 4096)

    refused = coordinator_publish(b, run_dir)
    assert refused.returncode != 0 and "published policy" not in refused.stdout, refused.stdout
    message = " ".join(refused.stderr.split())  # the console wraps long lines
    assert "holds another checkpoint" in message and "--version 2" in message, message
    assert not leftover.exists()  # the next start cleaned the killed publish up

    finished = coordinator_publish(a, run_dir)
    assert finished.returncode == 0, finished.stderr
    assert f"published policy v1 from {a}" in finished.stdout
    served = run_dir / "policies" / "v1" / "files"
    assert tree_bytes(served) == tree_bytes(a)
    assert list(store.staging.iterdir()) == []


def test_finishing_an_interrupted_publish_announces_the_version(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert coordinator_publish(make_checkpoint(tmp_path / "Z", seed=0, size_bytes=64 * 1024), run_dir).returncode == 0
    a = make_checkpoint(tmp_path / "A", seed=1, size_bytes=64 * 1024)
    store = VersionStore(run_dir / "policies")
    # `publish A` killed after the store installed v1 and before it announced it
    publish_checkpoint(a, 1, load_or_create_identity(run_dir), store, shard_size_bytes=SHARD)
    store.announce(0)

    finished = coordinator_publish(a, run_dir)
    assert finished.returncode == 0, finished.stderr
    assert store.announced() == 1
    assert OriginSource(store).versions_response().latest == 1


@pytest.mark.parametrize("flags", [["--set", "bogus=1"], []])
def test_a_fatal_error_under_json_logs_is_a_json_line(tmp_path: Path, flags: list[str]) -> None:
    argv = [str(BIN / "prime-relay"), "serve", "--json-logs", "--data-dir", str(tmp_path), *flags]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 2, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]  # every line is one JSON object
    assert lines[-1]["level"] == "error" and lines[-1]["exit_code"] == 2, lines
    assert ("bogus" if flags else "upstream") in lines[-1]["event"]


@pytest.mark.parametrize("mode", ["truncate", "shorten"])
def test_a_relay_that_cuts_shards_short_is_banned_fast(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity, mode: str
) -> None:
    checkpoint = publish(tmp_path, tmp_path / "store", coordinator, 1)
    origin = nodes.origin(tmp_path / "store")
    with FaultyRelay(origin, mode) as faulty:
        events, seconds, code = timed_fetch(nodes, 1, [faulty.url, origin], coordinator.node_id, tmp_path / "both")
        assert code == 0 and events[-1]["event"] == "done", events[-3:]
        assert tree_bytes(tmp_path / "both" / "v1") == tree_bytes(checkpoint)
        relays = {r["url"]: r for r in events[-1]["relays"]}  # type: ignore[attr-defined]
        # banned at its first whole short body or second cut one; the fetches already in flight fail too
        assert relays[faulty.url]["banned"] and relays[faulty.url]["num_failures"] <= 8, relays[faulty.url]
        assert float(events[-1]["seconds"]) < 5, events[-1]  # type: ignore[arg-type]

        faulty.num_requests = 0
        events, seconds, code = timed_fetch(nodes, 1, [faulty.url], coordinator.node_id, tmp_path / "alone")
        assert code == 1 and events[-1]["error"] == "integrity", events[-3:]
        print(f"{mode}: a lone relay refused after {seconds:.2f} s wall, {faulty.num_requests} requests")
        assert seconds < 12, f"a lone truncating relay took {seconds:.1f} s to refuse"
        assert faulty.num_requests <= 1 + 2 * 8  # the manifest, then at most two rounds of the parallel fetches


def test_a_lone_relay_answering_503_forever_ends_the_fetch_with_bounded_requests(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    publish(tmp_path, tmp_path / "store", coordinator, 1)
    origin = nodes.origin(tmp_path / "store")
    with FaultyRelay(origin, "busy") as busy:
        args = ("--not-ready-timeout-s", "8")
        events, seconds, code = timed_fetch(nodes, 1, [busy.url], coordinator.node_id, tmp_path / "out", *args)
        print(f"a lone 503 relay: gave up after {seconds:.1f} s wall, {busy.num_requests} requests")
        assert code == 1 and events[-1]["error"] == "unavailable", events[-3:]
        assert "503" in str(events[-1]["detail"]) and "another relay" in str(events[-1]["detail"])
        assert seconds < 30
        # 12 shards, each asked again after 0.3, 0.6, 1.2, 2.4, 4.8 s: about 6 requests each before the
        # deadline (a fixed 0.3 s retry made 12 / 0.3 = 40 a second, without end)
        assert busy.num_requests <= 1 + 12 * 7, busy.num_requests


def test_one_key_two_runs_a_client_takes_only_its_runs_version_and_blames_no_relay(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    """A coordinator key signing for two runs: each run's origin publishes its own version 1. A node of run b
    listing both origins gets run b's checkpoint, and the origin of run a is not banned (it does not lie)."""
    checkpoints = {}
    origins = {}
    for seed, run in enumerate(("a", "b")):
        checkpoints[run] = make_checkpoint(tmp_path / f"ckpt-{run}", seed=seed)
        store = VersionStore(tmp_path / f"store-{run}")
        publish_checkpoint(checkpoints[run], 1, coordinator, store, shard_size_bytes=SHARD, run_name=run)
        origins[run] = nodes.origin(store.root)

    events, _, code = timed_fetch(
        nodes, 1, [origins["a"], origins["b"]], coordinator.node_id, tmp_path / "b", "--run-name", "b"
    )
    assert code == 0 and events[-1]["event"] == "done", events[-3:]
    assert tree_bytes(tmp_path / "b" / "v1") == tree_bytes(checkpoints["b"])
    relays = {r["url"]: r for r in events[-1]["relays"]}  # type: ignore[attr-defined]
    assert not relays[origins["a"]]["banned"], relays

    events, _, code = timed_fetch(nodes, 1, [origins["a"]], coordinator.node_id, tmp_path / "only-a", "--run-name", "b")
    assert code == 1 and events[-1]["error"] == "not_found", events[-3:]
    assert "of run 'b'" in str(events[-1]["detail"]) and "is of run 'a'" in str(events[-1]["detail"])
    assert any(e["event"] == "manifest_other_run" for e in events)
    assert not (tmp_path / "only-a" / "v1").exists()
