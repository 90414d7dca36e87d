"""A worker keeps working through download faults, with real coordinator, relay and `prime-worker join` processes.

- Its only relay is seconds behind a new version (origin fallback off): the worker waits for it, saying so,
  instead of exiting with "no relay holds version 1".
- The coordinator publishes a version whose signed patch cannot be rebuilt (a header that inflates to 24 MiB):
  the worker refuses that version once, hands its tasks back, stays up, and works on the next version.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from protocol.identity import load_or_create_identity
from protocol.schemas import PATCH_ENCODING
from shardcast.manifest import PatchOf, make_manifest, result_files_of, sign_manifest
from shardcast.origin import FILES_DIR, PATCH_FILE_NAME, _hash_shards
from shardcast.store import MANIFEST_NAME, VersionStore
from tests.integration.network import Network, running_network, tiny_policy
from tests.support.shardcast_nodes import header_bomb, wait_until

pytestmark = pytest.mark.slow


def submitted(net: Network, version: int) -> bool:
    return any(e["data"].get("policy_version") == version for e in net.events("submit"))


def test_a_worker_waits_for_a_relay_a_few_seconds_behind(network: Network) -> None:
    net = network
    settings = {"poll_interval_s": 45, "p2p.enabled": "false"}  # it learns of a new version only at its next poll
    relay_url, _ = net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id, **settings)
    worker = net.start_worker("worker", "hf", [relay_url], "--set", "origin_fallback_enabled=false", "--no-p2p")
    wait_until(lambda: submitted(net, 0), 240, "the worker to submit under policy v0")
    net.publish(1)
    wait_until(lambda: submitted(net, 1), 240, "the worker to submit under policy v1 once its relay has it")
    assert worker.poll() is None, net.worker_log("worker")
    assert "waiting for policy v1" in (net.root / "worker.log").read_text(errors="replace")


def install_bad_patch(net: Network, version: int, base: int) -> None:
    """A patch version the coordinator signed (its key, its store) whose patch cannot be rebuilt."""
    store = VersionStore(net.root / "run" / "policies")
    signer = load_or_create_identity(net.root / "run")
    patch = header_bomb(24 * 1024 * 1024)
    staged = store.new_staging_dir(f"v{version}")
    (staged / FILES_DIR).mkdir()
    (staged / FILES_DIR / PATCH_FILE_NAME).write_bytes(patch)
    served = [(PATCH_FILE_NAME, len(patch))]
    shard_size = 16384
    hashes = _hash_shards(staged / FILES_DIR, served, shard_size, "blake3")
    result = result_files_of(net.checkpoints[version], "blake3")
    manifest = make_manifest(
        version, served, hashes, shard_size, "blake3", time.time(), PatchOf(base, PATCH_ENCODING, result)
    )
    (staged / MANIFEST_NAME).write_bytes(sign_manifest(signer, manifest).model_dump_json().encode())
    store.install_version(staged, version)


def test_a_bad_signed_patch_is_refused_once_and_the_worker_goes_on(tmp_path: Path) -> None:
    checkpoints = [tiny_policy(tmp_path / f"policy-{v}", seed=v) for v in range(3)]
    with running_network(tmp_path, checkpoints, sections={"policy": {"patches_enabled": False}}) as net:
        worker = net.start_worker("worker", "hf", [], "--no-p2p")  # from the coordinator's origin
        wait_until(lambda: submitted(net, 0), 240, "the worker to submit under policy v0")
        install_bad_patch(net, 1, base=0)
        net.publish(1)  # finishes the "interrupted" publish: the ledger makes the bad version current
        wait_until(lambda: "policy v1 refused" in net.worker_log("worker"), 120, "the worker to refuse policy v1")
        time.sleep(12)  # tasks of v1 keep coming: each is handed back, the patch is not fetched again
        assert worker.poll() is None, net.worker_log("worker")
        net.publish(2)
        wait_until(lambda: submitted(net, 2), 240, "the worker to submit under policy v2")
        assert worker.poll() is None, net.worker_log("worker")
        log = (tmp_path / "worker.log").read_text(errors="replace")
        assert log.count("download of policy v1 failed") <= 1, log[-3000:]
        assert log.count("handing task") >= 1
