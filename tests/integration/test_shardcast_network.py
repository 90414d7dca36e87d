"""SHARDCAST end to end: origin, relays and clients as real processes on 127.0.0.1.

Covers the issue's acceptance list: a chain of relays delivering bit-identical copies (and
curl fetching from a relay), failover when a relay dies mid-download, a corrupting relay
caught and demoted, forged manifests refused by relays and clients, and publishing under
pruning never showing anyone a half-written version.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from protocol.errors import PrimeError
from protocol.identity import NodeIdentity
from shardcast.client.download import download_version, latest_version
from shardcast.client.transfer import TransferOptions
from shardcast.format.store import VersionStore
from shardcast.origin.publish import publish_checkpoint
from tests.support.shardcast_nodes import (
    Nodes,
    corrupt_shard,
    events_of,
    get_json,
    holds,
    make_checkpoint,
    metric,
    stream_events,
    tree_bytes,
    wait_until,
)

pytestmark = pytest.mark.slow
SHARD = 256 * 1024


def publish(tmp_path: Path, store: Path, coordinator: NodeIdentity, version: int, **kwargs: int) -> Path:
    checkpoint = make_checkpoint(tmp_path / f"ckpt{version}", seed=version, **kwargs)
    publish_checkpoint(checkpoint, version, coordinator, VersionStore(store), shard_size_bytes=SHARD, keep_versions=3)
    return checkpoint


def origin_with_version_1(tmp_path: Path, nodes: Nodes, signer: NodeIdentity, **kwargs: int) -> tuple[Path, str]:
    """Publish version 1 (signed by ``signer``) into a fresh store and serve it: (checkpoint, origin URL)."""
    checkpoint = publish(tmp_path, tmp_path / "store", signer, 1, **kwargs)
    return checkpoint, nodes.origin(tmp_path / "store")


def test_chain_of_two_relays_delivers_bit_identical_copies(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    checkpoint, origin = origin_with_version_1(tmp_path, nodes, coordinator)
    relay_a, _ = nodes.relay([origin], coordinator.node_id)
    relay_b, _ = nodes.relay([relay_a], coordinator.node_id)  # chained: b mirrors a
    wait_until(lambda: holds(relay_b, 1), 60, "relay b to mirror version 1 through relay a")
    fetches = [
        nodes.fetch(1, [relay_a, relay_b], coordinator.node_id, tmp_path / "client0"),
        nodes.fetch(1, [relay_b], coordinator.node_id, tmp_path / "client1"),
        nodes.fetch(1, [relay_b, relay_a], coordinator.node_id, tmp_path / "client2", "--parallel", "2"),
    ]
    expected = tree_bytes(checkpoint)
    for index, proc in enumerate(fetches):
        events = events_of(proc)
        assert proc.returncode == 0 and events[-1]["event"] == "done", events[-3:]
        assert tree_bytes(tmp_path / f"client{index}" / "v1") == expected
    assert (
        metric(relay_b, "shardcast_shards_verified_total")
        == get_json(f"{relay_b}/versions")["versions"][0]["num_shards"]
    )
    assert metric(relay_b, "shardcast_served_bytes_total") > 0


def test_curl_fetches_manifest_and_shards_from_a_relay(tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity) -> None:
    checkpoint, origin = origin_with_version_1(tmp_path, nodes, coordinator)
    relay, _ = nodes.relay([origin], coordinator.node_id)
    wait_until(lambda: holds(relay, 1), 60, "relay to mirror version 1")
    manifest = subprocess.run(["curl", "-sf", f"{relay}/v/1/manifest.json"], check=True, capture_output=True).stdout
    files = httpx.Response(200, content=manifest).json()["manifest"]["files"]
    concatenated = b"".join((checkpoint / entry["path"]).read_bytes() for entry in files)
    shard = subprocess.run(["curl", "-sf", f"{relay}/v/1/shards/2"], check=True, capture_output=True).stdout
    assert shard == concatenated[2 * SHARD : 3 * SHARD]
    part = subprocess.run(["curl", "-sf", "-r", "100-199", f"{relay}/v/1/shards/2"], check=True, capture_output=True)
    assert part.stdout == concatenated[2 * SHARD + 100 : 2 * SHARD + 200]
    refused = subprocess.run(["curl", "-s", "-w", "%{http_code}", f"{relay}/v/1/shards/999"], capture_output=True)
    assert refused.stdout.endswith(b"404") and b"out of range" in refused.stdout


def test_relay_killed_mid_download_clients_finish_from_the_other(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    checkpoint, origin = origin_with_version_1(tmp_path, nodes, coordinator, size_bytes=16 * 1024 * 1024)
    (relay_a, proc_a), (relay_b, _) = (
        nodes.relay([origin], coordinator.node_id),
        nodes.relay([origin], coordinator.node_id),
    )
    wait_until(lambda: holds(relay_a, 1) and holds(relay_b, 1), 60, "both relays to mirror version 1")
    fetch = nodes.fetch(1, [relay_a, relay_b], coordinator.node_id, tmp_path / "client", "--parallel", "1")
    events = []
    for event in stream_events(fetch):
        events.append(event)
        if event["event"] == "shard_done" and event["source"] == relay_a and proc_a.poll() is None:
            nodes.stop(proc_a)  # SIGKILL: the relay vanishes between two shards or mid-shard
    fetch.wait(timeout=120)
    assert fetch.returncode == 0 and events[-1]["event"] == "done", events[-3:]
    assert proc_a.poll() is not None
    assert tree_bytes(tmp_path / "client" / "v1") == tree_bytes(checkpoint)
    done_from_b = [e for e in events if e["event"] == "shard_done" and e["source"] == relay_b]
    failed_on_a = [e for e in events if e["event"] == "shard_failed" and e["source"] == relay_a]
    assert done_from_b and failed_on_a and all(e["kind"] == "network" for e in failed_on_a)


def test_corrupting_relay_is_detected_demoted_and_routed_around(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    checkpoint, good = origin_with_version_1(tmp_path, nodes, coordinator)
    store = tmp_path / "store"
    # the test's bad relay: a server over a copy of the version with shard 3 flipped (genuine manifest)
    evil_store = tmp_path / "evil-store"
    shutil.copytree(store / "v1", evil_store / "v1")
    corrupt_shard(evil_store / "v1", 3)
    evil = nodes.origin(evil_store)
    # a client that asks the evil relay for shard 3 first
    fetch = nodes.fetch(1, [evil, good], coordinator.node_id, tmp_path / "client", "--parallel", "4")
    events = events_of(fetch)
    assert fetch.returncode == 0, events[-3:]
    assert tree_bytes(tmp_path / "client" / "v1") == tree_bytes(checkpoint)
    corrupt = [e for e in events if e["event"] == "shard_failed" and e["kind"] == "integrity"]
    assert all(e["source"] == evil and e["index"] == 3 for e in corrupt)
    relays = {r["url"]: r for r in events[-1]["relays"]}
    assert relays[evil]["banned"] == bool(corrupt)
    assert any(e["event"] == "shard_done" and e["index"] == 3 and e["source"] == good for e in events)
    # a relay mirroring only from the evil one never serves shard 3, and counts the corruption
    relay, _ = nodes.relay([evil], coordinator.node_id, shard_wait_s=0.2, upstream_ban_s=0.5)
    wait_until(
        lambda: metric(relay, 'shardcast_fetch_failures_total{kind="integrity"}') >= 1, 60, "the relay to catch it"
    )
    response = httpx.get(f"{relay}/v/1/shards/3", timeout=10)
    assert response.status_code == 503 and response.json()["error"] == "not_ready"
    assert httpx.get(f"{relay}/v/1/shards/0", timeout=10).status_code in (200, 503)


def test_manifest_not_signed_by_the_coordinator_is_refused(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    impostor = NodeIdentity.generate()
    _, forger = origin_with_version_1(tmp_path, nodes, impostor)
    relay, _ = nodes.relay([forger], coordinator.node_id)
    wait_until(lambda: metric(relay, "shardcast_manifests_rejected_total") >= 1, 30, "the relay to refuse it")
    health = get_json(f"{relay}/healthz")
    assert health["status"] == "degraded"  # the relay says why it serves nothing, for a probe or a person
    [problem] = health["problems"]
    assert problem.startswith(f"refusing manifests: version 1 from {forger}")
    assert impostor.node_id in problem and coordinator.node_id in problem
    assert get_json(f"{relay}/versions")["versions"] == []
    assert httpx.get(f"{relay}/v/1/manifest.json", timeout=5).status_code == 404
    fetch = nodes.fetch(1, [forger], coordinator.node_id, tmp_path / "client")
    events = events_of(fetch)
    assert fetch.returncode == 1
    assert events[-1]["event"] == "error" and events[-1]["error"] == "integrity"
    assert not (tmp_path / "client" / "v1").exists()


def test_publishing_while_pruning_never_exposes_a_half_written_version(
    tmp_path: Path, nodes: Nodes, coordinator: NodeIdentity
) -> None:
    store = tmp_path / "store"
    checkpoints = {1: publish(tmp_path, store, coordinator, 1, size_bytes=1024 * 1024)}
    origin = nodes.origin(store)
    relay, _ = nodes.relay([origin], coordinator.node_id, keep_versions=2)
    stop = threading.Event()
    problems: list[str] = []

    def publisher() -> None:
        for version in range(2, 9):
            checkpoints[version] = make_checkpoint(tmp_path / f"ckpt{version}", seed=version, size_bytes=1024 * 1024)
            publish_checkpoint(
                checkpoints[version], version, coordinator, VersionStore(store), shard_size_bytes=SHARD, keep_versions=2
            )
            time.sleep(0.3)
        stop.set()

    def watch_store() -> None:
        # every version directory anyone can see is complete: manifest and every shard present
        while not stop.is_set():
            for version_dir in store.glob("v*"):
                try:
                    manifest = json.loads((version_dir / "manifest.json").read_bytes())["manifest"]
                    sizes = {f["path"]: (version_dir / "files" / f["path"]).stat().st_size for f in manifest["files"]}
                except FileNotFoundError:
                    if version_dir.exists():
                        problems.append(f"{version_dir.name} is visible without its manifest or files")
                    continue  # pruned between glob and listing: gone at once, also fine
                if sizes != {f["path"]: f["size_bytes"] for f in manifest["files"]}:
                    problems.append(f"{version_dir.name}: files on disk {sizes}")

    threads = [threading.Thread(target=publisher), threading.Thread(target=watch_store)]
    for thread in threads:
        thread.start()
    options = TransferOptions(num_parallel=2, backoff_base_s=0.05, max_attempts_per_shard=3, fsync_enabled=False)
    fetched: list[int] = []
    refused = 0
    try:
        while not stop.is_set():
            for source in (origin, relay):
                try:
                    version = asyncio.run(latest_version([source]))
                    path = download_version(version, [source], coordinator.node_id, tmp_path / "client", options)
                except PrimeError:
                    refused += 1  # pruned mid-download: refused cleanly, nothing exposed
                    continue
                fetched.append(version)
                if tree_bytes(path) != tree_bytes(checkpoints[version]):
                    problems.append(f"client copy of version {version} differs")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not problems, problems
    assert len(set(fetched)) >= 2, f"fetched {fetched}, refused {refused}"
    assert VersionStore(store).versions() == [7, 8]
    leftovers = [p.name for p in (tmp_path / "client").iterdir() if p.name.startswith("v")]
    assert all(tree_bytes(tmp_path / "client" / name) == tree_bytes(checkpoints[int(name[1:])]) for name in leftovers)
