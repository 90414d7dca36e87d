"""Publishing policy versions: the SHARDCAST origin store and the ledger, kept in step.

A version is published in two steps: :func:`shardcast.origin.publish.publish_checkpoint` shards, signs
and atomically installs it in the origin store; then the ledger records the signed manifest
and makes it current. A crash between the two leaves a version in the store that the ledger
does not know; :func:`publish_policy` finishes such a publication instead of failing, so a
restarted coordinator (or the same command run again) converges, but only when the stored
version holds exactly the checkpoint asked for: otherwise it refuses and says why, so a
version number never stands for other bytes than the ones published under it.

What the origin store keeps is decided in one place, :func:`origin_versions_to_remove`, and
applied after each publication by :func:`prune_origin`: the newest ``policy_keep_versions``
(at least async_level + 1, so every version a lagging worker may still generate with stays
downloadable), the current version, and every version a kept value patch's chain stands on,
down to a full version (so a worker a few versions behind, or a new one, can rebuild it), and in a
LoRA run the base (version 0), which every adapter version names as the version it is served on.
Whether a version is published as a patch is ``policy.patches_enabled`` and ``policy.full_every``
(:class:`shardcast.origin.publish.PatchPolicy`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ledger import Ledger
from protocol.errors import ConflictError, NotFoundError
from protocol.identity import NodeIdentity
from protocol.schemas import LORA_BASE_VERSION, SignedManifest
from shardcast.format.manifest import parse_signed_manifest
from shardcast.format.store import VersionStore, versions_to_prune
from shardcast.origin.publish import PatchPolicy, chain_bases, publish_checkpoint, stored_version_differs

log = logging.getLogger("coordinator.loop.policies")


def policy_store(config: CoordinatorConfig) -> VersionStore:
    return VersionStore(config.policy_store_dir)


def with_vocab_size(config: CoordinatorConfig, checkpoint_dir: Path) -> CoordinatorConfig:
    """The config with policy.vocab_size read from the checkpoint's config.json when it is not set (unchanged
    when it is set, or when the checkpoint names none: then token ids are checked by the validators only)."""
    if config.policy.vocab_size is not None:
        return config
    try:
        found = json.loads((checkpoint_dir / "config.json").read_text())
        value = found.get("vocab_size", found.get("text_config", {}).get("vocab_size"))  # a vision-language one's
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("cannot read the vocab_size of %s (%s); token ids are not checked at the door", checkpoint_dir, exc)
        return config
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 2**31:
        log.warning("%s names no valid vocab_size; token ids are not checked at the door", checkpoint_dir)
        return config
    return config.model_copy(update={"policy": config.policy.model_copy(update={"vocab_size": value})})


def without_links(checkpoint_dir: Path, target: Path) -> Path:
    """``checkpoint_dir`` itself, or, when it holds symlinks (a Hugging Face cache snapshot links into its blobs),
    the same files as regular files under ``target`` (hard links to the linked-to bytes where possible, so
    nothing is copied): the origin publishes regular files only."""
    if not any(path.is_symlink() for path in checkpoint_dir.rglob("*")):
        return checkpoint_dir
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    for path in sorted(checkpoint_dir.rglob("*")):
        if path.is_dir():
            continue
        placed = staging / path.relative_to(checkpoint_dir)
        placed.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path.resolve(), placed)
        except OSError:
            shutil.copy2(path.resolve(), placed)
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)
    log.info("start checkpoint %s holds links; publishing its files as %s", checkpoint_dir, target)
    return target


def published_version(ledger: Ledger) -> int | None:
    """The newest version the ledger has a manifest for (None before the first publication)."""
    try:
        return ledger.manifest(None).manifest.version
    except NotFoundError:
        return None


def origin_versions_to_remove(
    held: Iterable[int], current: int, keep_versions: int, bases: Iterable[int] = ()
) -> list[int]:
    """The origin store's retention policy: of the versions ``held``, those to delete.

    Kept: the newest ``keep_versions``, the ``current`` (announced) version, and every version in
    ``bases`` (versions that something still served is expressed against, e.g. a patch's base).
    """
    return versions_to_prune(held, keep_versions, protected={current, *bases})


def prune_origin(store: VersionStore, config: CoordinatorConfig, current: int) -> list[int]:
    """Apply :func:`origin_versions_to_remove` to ``store``, keeping the patch chains of the versions kept;
    returns the versions removed."""
    held = store.versions()
    kept = {current, *sorted(held, reverse=True)[: config.policy_keep_versions]}
    doomed = origin_versions_to_remove(held, current, config.policy_keep_versions, chain_bases(store, kept))
    for version in doomed:
        store.remove_version(version)
    if doomed:
        log.info("origin store: removed versions %s (keeping the newest %d)", doomed, config.policy_keep_versions)
    return doomed


def lora_adapter(config: CoordinatorConfig, checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` is a LoRA run's adapter version (served on the run's base, v0)."""
    from engines.adapters import is_adapter_dir

    return config.orchestrator.trainer.lora.enabled and is_adapter_dir(checkpoint_dir)


def publish_policy(
    checkpoint_dir: Path,
    version: int,
    identity: NodeIdentity,
    store: VersionStore,
    ledger: Ledger,
    config: CoordinatorConfig,
) -> SignedManifest:
    """Make ``checkpoint_dir`` policy ``version``: in the origin store, then current in the ledger; then prune the
    origin store (after the ledger moved on, so no version the ledger still calls current is ever removed)."""
    store.clear_leftovers_if_idle()  # a publish killed mid-write left its staging folder: remove it
    if version in store.versions():
        signed = parse_signed_manifest(store.manifest_path(version).read_bytes())
        difference = stored_version_differs(store, version, checkpoint_dir)  # finish it only if it is this one
        if difference is not None:
            raise ConflictError(
                f"policy v{version} in {store.root} holds another checkpoint than {checkpoint_dir} ({difference}); "
                f"publish that checkpoint again to finish an interrupted publish, or publish this one as a new "
                f"version (--version {max(version, published_version(ledger) or 0) + 1})"
            )
        announced = store.announced()
        if announced is None or announced < version:  # the killed publish installed it but never announced it
            store.announce(version)
        log.info("policy v%d was already in the origin store; announcing it to the ledger", version)
    else:
        signed = publish_checkpoint(
            checkpoint_dir,
            version,
            identity,
            store,
            shard_size_bytes=config.policy.shard_size_bytes,
            keep_versions=None,
            patches=PatchPolicy(enabled=config.policy.patches_enabled, full_every=config.policy.full_every),
            run_name=config.run_name,
            served_on=LORA_BASE_VERSION if lora_adapter(config, checkpoint_dir) else None,
        )
    if published_version(ledger) != version:
        ledger.publish(signed)
    prune_origin(store, config, version)
    manifest = signed.manifest
    log.info(
        "policy v%d is current (%s: %d bytes in %d shards, for a %d-byte checkpoint)",
        version,
        "full" if manifest.kind == "full" else f"patch against v{manifest.base_version}",
        manifest.total_size_bytes,
        len(manifest.shards),
        manifest.result_size_bytes,
    )
    return signed
