"""Prometheus metrics of one SHARDCAST server (origin or relay), in a registry of its own.

A registry per server (not the process-global one) lets several servers live in one process,
as they do in tests and when the coordinator mounts the origin next to its own metrics.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.types import Scope

from protocol.schemas import PolicyManifest


class ShardcastMetrics:
    def __init__(self, role: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"role": role}
        self.requests = Counter(
            "shardcast_requests",
            "HTTP requests answered, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.bytes_served = Counter("shardcast_served_bytes", "Shard bytes sent to clients.", registry=self.registry)
        self.shards_verified = Counter(
            "shardcast_shards_verified", "Shards fetched from upstream whose hash matched.", registry=self.registry
        )
        self.bytes_fetched = Counter(
            "shardcast_fetched_bytes", "Verified shard bytes fetched from upstream.", registry=self.registry
        )
        self.fetch_failures = Counter(
            "shardcast_fetch_failures",
            "Failed shard fetches from upstream, by kind (network, integrity, missing, not_ready).",
            ["kind"],
            registry=self.registry,
        )
        self.manifests_rejected = Counter(
            "shardcast_manifests_rejected",
            "Manifests refused: bad signature, wrong signer, wrong version or malformed.",
            registry=self.registry,
        )
        self.latest_version = Gauge(
            "shardcast_latest_version", "Newest version held (-1 when none).", registry=self.registry
        )
        self.versions_held = Gauge("shardcast_versions_held", "Versions held.", registry=self.registry)
        self.version_bytes = Gauge(
            "shardcast_version_bytes",
            "Bytes to download for each version held, by kind (full checkpoint or value patch).",
            ["version", "kind"],
            registry=self.registry,
        )
        self.version_checkpoint_bytes = Gauge(
            "shardcast_version_checkpoint_bytes",
            "Bytes of the checkpoint each version held stands for (a patch rebuilds this many).",
            ["version"],
            registry=self.registry,
        )
        self.patch_versions_held = Gauge(
            "shardcast_patch_versions_held", "Versions held that are value patches.", registry=self.registry
        )
        self.info = Gauge(
            "shardcast_info", "Constant 1, labelled with the server's role.", ["role"], registry=self.registry
        )
        self.info.labels(**labels).set(1)
        self.latest_version.set(-1)

    def observe_versions(self, manifests: Iterable[PolicyManifest]) -> None:
        """Set the per-version byte gauges to the versions held now (pruned versions' series go away)."""
        self.version_bytes.clear()
        self.version_checkpoint_bytes.clear()
        num_patches = 0
        for manifest in manifests:
            self.version_bytes.labels(version=str(manifest.version), kind=manifest.kind).set(manifest.total_size_bytes)
            self.version_checkpoint_bytes.labels(version=str(manifest.version)).set(manifest.result_size_bytes)
            num_patches += manifest.kind == "patch"
        self.patch_versions_held.set(num_patches)

    def observe_request(self, scope: Scope, status: int | None, _seconds: float) -> None:
        """Count one answered request by route kind and status (:class:`runtime.http_metrics.RequestMetrics`
        calls it); one the app answered nothing is left out."""
        if status is not None:
            self.requests.labels(route=_route_kind(scope.get("path", "")), status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _route_kind(path: str) -> str:
    if "/shards/" in path:
        return "shard"
    if path.endswith("/manifest.json"):
        return "manifest"
    for name in ("versions", "healthz", "metrics"):
        if path.endswith(f"/{name}"):
            return name
    return "other"
