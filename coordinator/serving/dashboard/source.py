"""What `GET /v1/dashboard` returns: one consistent-enough picture of the run, built from the ledger.

Reads the run status and the nodes table (engine, versions held, heartbeat tokens/s) directly,
and the event log through :class:`~coordinator.serving.dashboard.history.RunHistory`, which it brings up
to date on each call. Everything here is read-only and public: node ids, engines, counts and
verdict reasons, never an IP address, a key or the run secret. The tokens/s series is the run's
history from the ledger (completion tokens of each submit event), so a page opened late, or
served by a restarted coordinator, still draws the whole run; the live figure (the sum of the
workers' heartbeats) is in the nodes. Relays come from a :class:`~coordinator.serving.dashboard.relays.RelayWatch`
(when the coordinator is on gossip): only its cached answers are read here, never a relay.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from coordinator.ledger.views import LedgerViews
from coordinator.serving.dashboard.history import RunHistory
from coordinator.serving.dashboard.relays import RelayWatch
from protocol.schemas import (
    MAX_POLICY_VERSION,
    MAX_TOKENS_PER_S,
    Dashboard,
    DashboardAudit,
    DashboardNode,
    DashboardRelay,
    RunStatus,
    VersionSpread,
)

MAX_NODES = 200
MAX_VERSIONS = 16
EVENT_PAGE_SIZE = 1000
MAX_EVENT_PAGES_PER_READ = 50  # a coordinator restarted under a long run catches up over a few reads


class DashboardSource:
    """Builds :class:`~protocol.schemas.Dashboard` snapshots for one ledger; safe to call from several threads."""

    def __init__(
        self,
        views: LedgerViews,
        relays: RelayWatch | None = None,
        status: Callable[[], RunStatus] | None = None,
        audit: DashboardAudit | None = None,
    ) -> None:
        self.views = views
        self.audit = audit
        self.relays = relays
        self.status = status or views.status
        """What ``GET /v1/status`` says (the run's steps in all and whether it ended: the page's ETA)."""
        self.history = RunHistory()
        self._lock = threading.Lock()

    def snapshot(self) -> Dashboard:
        with self._lock:
            self._catch_up()
            now = self.views.clock()
            status = self.status()
            node_views = self._nodes(now)
            relay_views = self.relays.relays() if self.relays is not None else []
            return Dashboard(
                generated_at=now,
                status=status,
                nodes=node_views,
                verdicts=list(reversed(self.history.recent)),
                rewards=list(self.history.rewards),
                versions=self._versions(node_views, relay_views),
                accepted_samples_per_s=self.history.accepted_samples_per_s(now),
                tokens_per_s=self.history.generated_tokens_per_s(now),
                relays=relay_views,
                training=self.history.training.summary(),
                audit=self.audit,
            )

    def _catch_up(self) -> None:
        for _ in range(MAX_EVENT_PAGES_PER_READ):
            page = self.views.events(self.history.after, EVENT_PAGE_SIZE)
            self.history.fold(page.events)
            if len(page.events) < EVENT_PAGE_SIZE:
                return

    def _nodes(self, now: float) -> list[DashboardNode]:
        live_after = now - self.views.scheduling.worker_live_s
        found = []
        for row in self.views.recent_nodes(MAX_NODES):
            # Stored by older ledgers before the wire schema bounded them: out-of-range values are dropped.
            held = sorted(
                {v for v in json.loads(row.versions_held_json) if isinstance(v, int) and 0 <= v <= MAX_POLICY_VERSION}
            )
            rate = row.tokens_per_s
            found.append(
                DashboardNode(
                    node_id=row.node_id,
                    role=row.role,
                    engine=row.engine,
                    policy_version=held[-1] if held else None,
                    versions_held=held,
                    tokens_per_s=rate if 0 <= rate <= MAX_TOKENS_PER_S else 0.0,
                    num_accepted=row.num_accepted,
                    num_rejected=row.num_rejected,
                    last_seen=row.last_seen,
                    live=row.last_seen >= live_after and not row.banned,
                    banned=row.banned,
                    ban_reason=row.ban_reason,
                    num_votes_agreed=row.num_votes_agreed,
                    num_votes_outvoted=row.num_votes_outvoted,
                    flagged=self.views.flagged(row),
                    credit_samples=row.credit_samples,
                    credit_tokens=row.credit_tokens,
                    credit_lost_samples=row.credit_lost_samples,
                    credit_lost_tokens=row.credit_lost_tokens,
                )
            )
        return found

    def _versions(self, node_views: list[DashboardNode], relay_views: list[DashboardRelay]) -> list[VersionSpread]:
        newest = sorted(self.history.versions, reverse=True)[:MAX_VERSIONS]
        return [
            VersionSpread(
                version=version,
                published_at=tally.published_at,
                total_size_bytes=tally.total_size_bytes,
                num_live_holders=sum(1 for n in node_views if n.live and version in n.versions_held),
                num_accepted=tally.num_accepted,
                num_rejected=tally.num_rejected,
                mean_reward=tally.mean_reward,
                num_relays=sum(1 for r in relay_views if r.reachable and version in r.versions_held),
                kind=tally.kind,
                base_version=tally.base_version,
                checkpoint_bytes=tally.checkpoint_bytes,
            )
            for version, tally in ((v, self.history.versions[v]) for v in newest)
        ]
