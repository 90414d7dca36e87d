"""Value patches through SHARDCAST, with real `prime-relay` processes on 127.0.0.1.

An origin publishes a mix of full versions and value patches (bf16 safetensors checkpoints
whose values change a little per version); relays mirror them; clients at different versions
rebuild each one bit-exact, from a version they hold or from the newest full one. Each attack
on the patch path is refused: a patch manifest someone else signed, a patch made against
another base than the signed one, a relay serving a flipped patch byte, and a coordinator-signed
manifest whose result hash is wrong.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.errors import IntegrityError, VersionRefusedError
from protocol.identity import NodeIdentity, load_or_create_identity
from protocol.schemas import PATCH_ENCODING, PolicyManifest
from shardcast.client.cache import WeightsCache
from shardcast.client.download import download_version
from shardcast.client.transfer import TransferOptions
from shardcast.format.manifest import PatchOf, list_checkpoint_files, make_manifest, result_files_of, sign_manifest
from shardcast.format.store import MANIFEST_NAME, VersionStore
from shardcast.origin.publish import (
    FILES_DIR,
    PATCH_FILE_NAME,
    RESULT_DIR,
    PatchPolicy,
    _hash_shards,
    checkpoint_dir_of,
    publish_checkpoint,
)
from tests.support.shardcast_nodes import Nodes, events_of, header_bomb, holds, metric, tree_bytes, wait_until

pytestmark = pytest.mark.slow
SHARD = 64 * 1024
NUM_ELEMENTS = 96 * 1024
FAST = TransferOptions(fsync_enabled=False, backoff_base_s=0.05, hedge_after_s=5.0, max_attempts_per_shard=4)


def write_checkpoint(directory: Path, version: int, seed: int = 0) -> Path:
    """A bf16 safetensors checkpoint: version ``v`` differs from ``v - 1`` in about 1% of its values."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    values = rng.standard_normal(2 * NUM_ELEMENTS).astype(np.float32)
    for step in range(1, version + 1):
        step_rng = np.random.default_rng(seed * 1000 + step)
        where = step_rng.choice(values.size, size=values.size // 100, replace=False)
        values[where] += step_rng.standard_normal(where.size).astype(np.float32) * 0.05
    tensor = torch.from_numpy(values).to(torch.bfloat16)
    directory.mkdir(parents=True)
    save_file(
        {"embed.weight": tensor[:NUM_ELEMENTS].reshape(256, -1), "lm_head.weight": tensor[NUM_ELEMENTS:].clone()},
        str(directory / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (directory / "config.json").write_text(json.dumps({"hidden_size": 384, "torch_dtype": "bfloat16"}))
    return directory


class Run:
    """An origin store the test publishes into, with the coordinator's key."""

    def __init__(
        self, tmp_path: Path, full_every: int = 100, keep_versions: int | None = None, shard_size: int = SHARD
    ) -> None:
        self.shard_size = shard_size
        self.tmp_path = tmp_path
        self.store = VersionStore(tmp_path / "store")
        self.signer = load_or_create_identity(tmp_path / "coordinator")
        self.policy = PatchPolicy(full_every=full_every)
        self.keep_versions = keep_versions
        self.checkpoints: dict[int, Path] = {}

    def publish(self, version: int, patches: bool = True) -> PolicyManifest:
        checkpoint = write_checkpoint(self.tmp_path / f"ckpt{version}", version)
        self.checkpoints[version] = checkpoint
        signed = publish_checkpoint(
            checkpoint,
            version,
            self.signer,
            self.store,
            shard_size_bytes=self.shard_size,
            keep_versions=self.keep_versions,
            fsync_enabled=False,
            patches=self.policy if patches else None,
        )
        return signed.manifest

    def craft_patch(
        self, version: int, made_against: int, signed_base: int, result_hash: str | None = None
    ) -> PolicyManifest:
        """Install a coordinator-signed patch version by hand: made against one base, naming another."""
        from shardcast.format.patch import ENCODING, encode_patch

        checkpoint = write_checkpoint(self.tmp_path / f"ckpt{version}", version)
        self.checkpoints[version] = checkpoint
        staged = self.store.new_staging_dir(f"v{version}")
        (staged / FILES_DIR).mkdir()
        encode_patch(checkpoint_dir_of(self.store, made_against), checkpoint, staged / FILES_DIR / PATCH_FILE_NAME)
        served = [(PATCH_FILE_NAME, (staged / FILES_DIR / PATCH_FILE_NAME).stat().st_size)]
        result = result_files_of(checkpoint, "blake3")
        if result_hash is not None:
            result[0] = result[0].model_copy(update={"hash": result_hash})
        hashes = _hash_shards(staged / FILES_DIR, served, SHARD, "blake3")
        manifest = make_manifest(
            version, served, hashes, SHARD, "blake3", time.time(), PatchOf(signed_base, ENCODING, result)
        )
        (staged / MANIFEST_NAME).write_bytes(sign_manifest(self.signer, manifest).model_dump_json().encode())
        self.store.install_version(staged, version)
        self.store.announce(version)
        return manifest

    def install_patch_file(self, version: int, base: int, patch: bytes) -> None:
        """Install a coordinator-signed patch version whose patch file is ``patch`` (whatever it holds)."""
        checkpoint = write_checkpoint(self.tmp_path / f"ckpt{version}", version)
        self.checkpoints[version] = checkpoint
        staged = self.store.new_staging_dir(f"v{version}")
        (staged / FILES_DIR).mkdir()
        (staged / FILES_DIR / PATCH_FILE_NAME).write_bytes(patch)
        served = [(PATCH_FILE_NAME, len(patch))]
        hashes = _hash_shards(staged / FILES_DIR, served, self.shard_size, "blake3")
        result = result_files_of(checkpoint, "blake3")
        manifest = make_manifest(
            version, served, hashes, self.shard_size, "blake3", time.time(), PatchOf(base, PATCH_ENCODING, result)
        )
        (staged / MANIFEST_NAME).write_bytes(sign_manifest(self.signer, manifest).model_dump_json().encode())
        self.store.install_version(staged, version)
        self.store.announce(version)


@pytest.fixture
def nodes(tmp_path: Path) -> Any:
    started = Nodes(tmp_path)
    yield started
    started.stop_all()


def fetch(version: int, relays: list[str], run: Run, out: Path) -> tuple[Path, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    path = download_version(version, relays, run.signer.node_id, out, FAST, on_event=events.append)
    return path, events


def done_event(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(event for event in events if event["event"] == "done")


def assert_bit_exact(path: Path, checkpoint: Path) -> None:
    assert tree_bytes(path) == tree_bytes(checkpoint)


def test_origin_publishes_patches_when_smaller_and_full_every_n(tmp_path: Path) -> None:
    run = Run(tmp_path, full_every=4, keep_versions=2)
    kinds = [run.publish(version).kind for version in range(7)]
    assert kinds == ["full", "patch", "patch", "patch", "full", "patch", "patch"]
    # retention: the newest 2 (5, 6) and the chain they stand on, down to the full v4
    assert run.store.versions() == [4, 5, 6]
    assert (run.store.version_dir(6) / RESULT_DIR).is_dir()
    manifest = run.publish(7)
    assert (manifest.kind, manifest.base_version) == ("patch", 6)
    assert manifest.total_size_bytes < manifest.result_size_bytes / 5
    assert run.store.versions() == [4, 5, 6, 7]
    # a version that is noise, not a small step, is smaller full: published full
    noise = run.tmp_path / "noise"
    noise.mkdir()
    (noise / "model.safetensors").write_bytes(os.urandom(256 * 1024))
    signed = publish_checkpoint(noise, 8, run.signer, run.store, SHARD, keep_versions=2, patches=run.policy)
    assert signed.manifest.kind == "full"
    assert run.store.versions() == [4, 5, 6, 7, 8]  # v7 is kept, so is the chain it stands on
    run.publish(9)  # a patch on v8: the chain of the newest two stops at the full v8
    assert run.store.versions() == [8, 9]


def test_a_chain_of_twelve_versions_is_bit_exact(tmp_path: Path, nodes: Nodes) -> None:
    run = Run(tmp_path)
    for version in range(12):
        run.publish(version)
    origin = nodes.origin(run.store.root)
    relay, _ = nodes.relay([origin], run.signer.node_id, keep_versions=3)
    wait_until(lambda: holds(relay, 11) and holds(relay, 0), 60, "the relay mirrors v11 and its chain")
    # a worker following the run: every version rebuilt from the one before
    out = tmp_path / "follower"
    path, events = fetch(0, [relay], run, out)
    assert done_event(events)["kind"] == "full"
    for version in range(1, 12):
        path, events = fetch(version, [relay], run, out)
        done = done_event(events)
        assert (done["kind"], done["base"], done["chain"]) == ("patch", version - 1, [version])
        assert done["bytes"] < done["checkpoint_bytes"] / 5
        assert_bit_exact(path, run.checkpoints[version])
    # a newcomer holding nothing: full v0 (kept by the relay for the chain), then eleven patches
    path, events = fetch(11, [relay], run, tmp_path / "newcomer")
    done = done_event(events)
    assert (done["from"], done["base"], done["chain"]) == ("full", 0, list(range(1, 12)))
    assert done["bytes"] > done["checkpoint_bytes"]  # a long chain costs a newcomer more: full_every bounds it
    assert_bit_exact(path, run.checkpoints[11])
    assert metric(origin, 'shardcast_version_bytes{kind="patch",version="11"}') > 0
    assert metric(origin, "shardcast_patch_versions_held") == 11


def test_chain_or_full_and_full_fallback_when_the_base_is_gone(tmp_path: Path, nodes: Nodes) -> None:
    run = Run(tmp_path, full_every=4)
    for version in range(7):  # F0 P1 P2 P3 F4 P5 P6
        run.publish(version)
    origin = nodes.origin(run.store.root)
    out = tmp_path / "worker"
    fetch(1, [origin], run, out)
    _, events = fetch(3, [origin], run, out)  # held v1, then the patches 2 and 3
    assert {k: done_event(events)[k] for k in ("from", "base", "chain")} == {"from": "held", "base": 1, "chain": [2, 3]}
    _, events = fetch(6, [origin], run, out)  # v4 is full: its checkpoint, then 5 and 6
    assert {k: done_event(events)[k] for k in ("from", "base", "chain")} == {"from": "full", "base": 4, "chain": [5, 6]}
    # the base is gone from the worker's disk: the newest full version and the patches after it
    other = tmp_path / "other"
    fetch(2, [origin], run, other)
    shutil.rmtree(other / "v2")
    shutil.rmtree(other / "v1")
    path, events = fetch(3, [origin], run, other)  # v0 is still held: the patches from it
    route = {k: done_event(events)[k] for k in ("from", "base", "chain")}
    assert route == {"from": "held", "base": 0, "chain": [1, 2, 3]}
    for version in range(4):
        shutil.rmtree(other / f"v{version}")
    path, events = fetch(3, [origin], run, other)  # nothing held: the full v0 first
    route = {k: done_event(events)[k] for k in ("from", "base", "chain")}
    assert route == {"from": "full", "base": 0, "chain": [1, 2, 3]}
    assert_bit_exact(path, run.checkpoints[3])


def test_a_damaged_local_base_is_dropped_and_the_version_rebuilt_without_it(tmp_path: Path, nodes: Nodes) -> None:
    run = Run(tmp_path)
    for version in range(4):
        run.publish(version)
    origin = nodes.origin(run.store.root)
    out = tmp_path / "worker"
    fetch(2, [origin], run, out)
    damaged = out / "v2" / "model.safetensors"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(data))
    path, events = fetch(3, [origin], run, out)
    kinds = [event["event"] for event in events]
    assert "patch_refused" in kinds and "base_damaged" in kinds
    assert (done_event(events)["from"], done_event(events)["base"], done_event(events)["chain"]) == ("held", 1, [2, 3])
    assert_bit_exact(path, run.checkpoints[3])
    assert_bit_exact(out / "v2", run.checkpoints[2])  # rebuilt again, from v1


def test_a_patch_manifest_someone_else_signed_is_refused(tmp_path: Path, nodes: Nodes) -> None:
    run = Run(tmp_path)
    for version in range(3):
        run.publish(version)
    impostor = Run(tmp_path / "impostor")
    impostor.signer = NodeIdentity.generate()
    for version in range(3):
        impostor.publish(version)
    assert (
        PolicyManifest.model_validate_json(
            json.dumps(json.loads(impostor.store.manifest_path(2).read_bytes())["manifest"])
        ).kind
        == "patch"
    )
    honest = nodes.origin(run.store.root)
    forged = nodes.origin(impostor.store.root)
    out = tmp_path / "worker"
    fetch(1, [honest], run, out)
    with pytest.raises(IntegrityError, match="not by the trusted coordinator"):
        fetch(2, [forged], run, out)
    assert not (out / "v2").exists()
    path, events = fetch(2, [forged, honest], run, out)
    assert any(event["event"] == "manifest_refused" and event["source"] == forged for event in events)
    assert_bit_exact(path, run.checkpoints[2])


def test_a_patch_made_against_another_base_is_refused(tmp_path: Path, nodes: Nodes) -> None:
    run = Run(tmp_path)
    run.publish(0)
    run.publish(1)
    run.craft_patch(2, made_against=0, signed_base=1)  # signed as a patch on v1, made from v0
    origin = nodes.origin(run.store.root)
    out = tmp_path / "worker"
    fetch(1, [origin], run, out)
    events: list[dict[str, Any]] = []
    with pytest.raises(IntegrityError, match="cannot be rebuilt"):
        download_version(2, [origin], run.signer.node_id, out, FAST, on_event=events.append)
    assert [event["version"] for event in events if event["event"] == "patch_refused"] == [2]
    assert not (out / "v2").exists()
    assert_bit_exact(out / "v1", run.checkpoints[1])  # the base is intact and kept


def test_a_relay_serving_a_flipped_patch_byte_is_demoted(tmp_path: Path, nodes: Nodes) -> None:
    run = Run(tmp_path, shard_size=4096)
    for version in range(3):
        run.publish(version)
    origin = nodes.origin(run.store.root)
    bad_dir = tmp_path / "bad-relay"
    bad, _ = nodes.relay([origin], run.signer.node_id, data_dir=bad_dir)
    good, _ = nodes.relay([origin], run.signer.node_id)
    wait_until(lambda: holds(bad, 2) and holds(good, 2), 60, "both relays mirror v2")
    for shard in (bad_dir / "v2" / "shards").iterdir():  # verified when mirrored, flipped on disk afterwards
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    failures: list[dict[str, Any]] = []
    for attempt in range(8):  # relays are picked at random: until the bad one was asked for a shard
        out = tmp_path / f"worker{attempt}"
        fetch(1, [good], run, out)
        path, events = fetch(2, [bad, good], run, out)
        failures += [event for event in events if event["event"] == "shard_failed"]
        assert done_event(events)["kind"] == "patch"
        assert_bit_exact(path, run.checkpoints[2])
        if failures:
            break
    assert failures and all(event["kind"] == "integrity" and event["source"] == bad for event in failures)


def test_a_signed_patch_whose_result_hash_is_wrong_is_refused_and_full_still_works(
    tmp_path: Path, nodes: Nodes
) -> None:
    run = Run(tmp_path)
    run.publish(0)
    run.publish(1)
    run.craft_patch(2, made_against=1, signed_base=1, result_hash="0" * 64)
    run.publish(3, patches=False)
    origin = nodes.origin(run.store.root)
    out = tmp_path / "worker"
    fetch(1, [origin], run, out)
    events: list[dict[str, Any]] = []
    with pytest.raises(IntegrityError, match="not the signed one"):
        download_version(2, [origin], run.signer.node_id, out, FAST, on_event=events.append)
    assert not (out / "v2").exists()
    path, events = fetch(3, [origin], run, out)
    assert done_event(events)["kind"] == "full"
    assert_bit_exact(path, run.checkpoints[3])


def test_a_relay_tree_serves_patches_and_full_versions_to_clients_at_different_versions(
    tmp_path: Path, nodes: Nodes
) -> None:
    run = Run(tmp_path, full_every=4)
    for version in range(7):  # F0 P1 P2 P3 F4 P5 P6
        run.publish(version)
    origin = nodes.origin(run.store.root)
    first, _ = nodes.relay([origin], run.signer.node_id, keep_versions=2)
    second, _ = nodes.relay([first], run.signer.node_id, keep_versions=2)
    wait_until(lambda: all(holds(second, v) for v in (4, 5, 6)), 60, "the second relay mirrors v4-v6")
    listing = [info["version"] for info in httpx.get(f"{second}/versions").json()["versions"]]
    assert listing == [4, 5, 6]  # the newest two and the full version their chain stands on
    behind = tmp_path / "behind"
    fetch(4, [second], run, behind)
    path, events = fetch(5, [second], run, behind)
    assert (done_event(events)["from"], done_event(events)["base"]) == ("held", 4)
    assert_bit_exact(path, run.checkpoints[5])
    newcomer = tmp_path / "newcomer"
    path, events = fetch(6, [second], run, newcomer)
    assert (done_event(events)["from"], done_event(events)["chain"]) == ("full", [5, 6])
    assert_bit_exact(path, run.checkpoints[6])
    # the CLI shows the route and the bytes saved
    proc = nodes.fetch(6, [second, first], run.signer.node_id, behind)
    done = [event for event in events_of(proc) if event["event"] == "done"][-1]
    assert (done["kind"], done["base"], done["bytes_saved"] > 0) == ("patch", 5, True)
    assert_bit_exact(behind / "v6", run.checkpoints[6])
    assert sorted(list_checkpoint_files(behind / "v6")) == sorted(list_checkpoint_files(run.checkpoints[6]))


def test_a_signed_patch_whose_header_inflates_is_refused_once_and_the_node_goes_on(
    tmp_path: Path, nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad publish (a 24 MiB header in a few KB, signed by the coordinator) must not stop a node: the version is
    refused without the applier growing, remembered (never fetched again, its prefetch failure logged once), and
    the next version is fetched."""
    run = Run(tmp_path)
    run.publish(0)
    run.install_patch_file(1, base=0, patch=header_bomb(24 * 1024 * 1024))
    run.publish(2, patches=False)
    origin = nodes.origin(run.store.root)
    cache = WeightsCache([origin], run.signer.node_id, tmp_path / "node", options=FAST)

    async def scenario() -> tuple[int, Path]:
        await cache.ensure(0)
        tracemalloc.start()
        try:
            with pytest.raises(VersionRefusedError, match=r"over the .* limit its base allows"):
                await cache.ensure(1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        served = metric(origin, "shardcast_served_bytes_total")
        for _ in range(3):  # one prefetch per task, as the worker makes them
            cache.prefetch(1)
            with pytest.raises(VersionRefusedError):
                await cache.ensure(1)
        assert metric(origin, "shardcast_served_bytes_total") == served  # the bad patch is not fetched again
        path = await cache.ensure(2)
        await cache.aclose()
        return peak, path

    with caplog.at_level(logging.WARNING, logger="shardcast.client.cache"):
        peak, path = asyncio.run(scenario())
    assert peak < 32 * 1024 * 1024, f"refusing the patch took {peak} bytes"
    assert_bit_exact(path, run.checkpoints[2])
    warnings = [r.getMessage() for r in caplog.records if "policy v1" in r.getMessage()]
    assert len(warnings) == 1 and "cannot be rebuilt" in warnings[0], warnings
