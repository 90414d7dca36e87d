"""A standalone origin: `prime-relay publish` puts a checkpoint into a store by hand, `prime-relay origin` serves it.

The same publication and serving the coordinator does (:mod:`shardcast.origin.publish`), without a run:
a store directory, the coordinator's key from a key directory, and an HTTP server of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol.identity import load_or_create_identity
from shardcast.format.manifest import HashAlgorithm
from shardcast.format.store import VersionStore
from shardcast.http.server import create_app, run_event_loop, serve_http
from shardcast.origin.publish import OriginSource, PatchPolicy, publish_checkpoint


def publish_from_cli(
    checkpoint: Path,
    version: int,
    store_dir: Path,
    key_dir: Path,
    *,
    shard_size_bytes: int,
    hash_algorithm: HashAlgorithm,
    keep_versions: int,
    fsync_enabled: bool,
    link_enabled: bool,
    patches_enabled: bool,
    full_every: int,
    run_name: str | None,
) -> dict[str, Any]:
    """`prime-relay publish`: publish ``checkpoint`` as ``version`` into the store, signed with the key in
    ``key_dir`` (created if absent); what was published, as the command prints it."""
    identity = load_or_create_identity(key_dir)
    signed = publish_checkpoint(
        checkpoint,
        version,
        identity,
        VersionStore(store_dir),
        shard_size_bytes=shard_size_bytes,
        hash_algorithm=hash_algorithm,
        keep_versions=keep_versions,
        fsync_enabled=fsync_enabled,
        link_enabled=link_enabled,
        patches=PatchPolicy(enabled=patches_enabled, full_every=full_every),
        run_name=run_name,
    )
    manifest = signed.manifest
    summary: dict[str, Any] = {
        "version": manifest.version,
        "signer": signed.signer,
        "num_shards": len(manifest.shards),
        "total_bytes": manifest.total_size_bytes,
    }
    if manifest.kind == "patch":
        summary |= {
            "kind": "patch",
            "base_version": manifest.base_version,
            "checkpoint_bytes": manifest.result_size_bytes,
        }
    return summary


def serve_origin(store_dir: Path, host: str, port: int) -> None:
    """`prime-relay origin`: serve the store until SIGINT/SIGTERM (the coordinator mounts the same app)."""
    store = VersionStore(store_dir)
    store.clear_leftovers_if_idle()  # what a killed `prime-relay publish` left in staging
    app = create_app(OriginSource(store))
    run_event_loop(lambda: serve_http(app, host, port))
