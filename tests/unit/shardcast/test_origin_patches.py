"""When the origin publishes a value patch: only when it saves enough of the checkpoint's bytes."""

from __future__ import annotations

import os
from pathlib import Path

from protocol.identity import NodeIdentity
from shardcast.format.store import VersionStore
from shardcast.origin.publish import PatchPolicy, publish_checkpoint


def checkpoint(directory: Path, changed: bytes, kept: bytes) -> Path:
    directory.mkdir(parents=True)
    (directory / "changed.bin").write_bytes(changed)
    (directory / "kept.bin").write_bytes(kept)
    return directory


def publish_two(tmp_path: Path, kept_bytes: int, policy: PatchPolicy) -> str:
    """Publish v0 and a v1 whose only saving is ``kept_bytes`` of an unchanged file; v1's kind."""
    store = VersionStore(tmp_path / "store")
    signer = NodeIdentity.generate()
    kept = os.urandom(kept_bytes)
    for version in (0, 1):
        source = checkpoint(tmp_path / f"c{version}", os.urandom(1024 * 1024), kept)
        signed = publish_checkpoint(source, version, signer, store, shard_size_bytes=64 * 1024, patches=policy)
    return signed.manifest.kind


def test_a_patch_that_saves_a_fraction_of_a_percent_is_published_full(tmp_path: Path) -> None:
    # the new random file costs as much patched as whole: the patch saves only the 3 KiB kept file (0.3%)
    assert publish_two(tmp_path, 3 * 1024, PatchPolicy()) == "full"


def test_a_patch_that_saves_more_than_the_threshold_is_published(tmp_path: Path) -> None:
    assert publish_two(tmp_path, 512 * 1024, PatchPolicy()) == "patch"  # saves a third
    assert publish_two(tmp_path / "strict", 512 * 1024, PatchPolicy(min_saving_fraction=0.5)) == "full"


def test_adapter_versions_keep_the_base_they_are_served_on(tmp_path: Path) -> None:
    """A LoRA run: the base (v0) stays however far pruning goes, adapters patch only against adapters (never against
    the base, whose files are others), and a manifest without ``served_on`` signs the bytes it always did."""
    from shardcast.format.manifest import chain_closure
    from shardcast.origin.publish import prune_store, stored_manifests

    store = VersionStore(tmp_path / "store")
    signer = NodeIdentity.generate()
    base = checkpoint(tmp_path / "base", os.urandom(256 * 1024), os.urandom(256 * 1024))
    assert "served_on" not in publish_checkpoint(base, 0, signer, store).manifest.model_dump(mode="json")
    import torch
    from safetensors.torch import save_file

    weights = torch.randn(64, 256)
    for version in range(1, 6):
        adapter = tmp_path / f"adapter{version}"
        adapter.mkdir()
        weights[version] += 1.0  # a step changes a few rows
        save_file({"base_model.model.x.lora_B.weight": weights}, str(adapter / "adapter_model.safetensors"))
        signed = publish_checkpoint(
            adapter, version, signer, store, keep_versions=None, patches=PatchPolicy(), served_on=0
        )
        assert signed.manifest.served_on == 0
        assert signed.manifest.kind == ("full" if version == 1 else "patch")  # v1 has nothing of its kind before
    assert chain_closure(stored_manifests(store), [5]) == {0, 4, 3, 2, 1}
    prune_store(store, keep_versions=1, protected={5})
    assert 0 in store.versions() and 5 in store.versions()
