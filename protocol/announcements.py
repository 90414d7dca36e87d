"""Gossip announcements: their topics, how they are signed, and the rules a node accepts them by.

An :class:`~protocol.schemas.Announcement` carries a body of one kind (a new policy version, a
relay address, task availability) and the signature of ``signer`` over the canonical JSON of
everything but the signature. :class:`AnnouncementFilter` is the one gate every received
message passes (it needs no sockets): it refuses oversize or malformed bytes, a kind that does
not belong on the topic, policy and task announcements not signed by the pinned coordinator,
signatures that do not verify, announcements older than the age window (or from the future),
exact replays, and announcements not newer than the last one accepted of the same kind and
signer (an older policy version, an out-of-date relay address). Each refusal raises the
matching :mod:`protocol.errors` class; :meth:`AnnouncementFilter.accept` turns it into a
counted, logged drop so hostile gossip never reaches the node's logic nor crashes it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from protocol.errors import (
    ConflictError,
    ForbiddenError,
    PrimeError,
    ProtocolError,
    ReplayedNonceError,
    StaleTimestampError,
)
from protocol.identity import NodeIdentity
from protocol.schemas import (
    Announcement,
    PolicyAnnouncement,
    RelayAnnouncement,
    SignedManifest,
    TaskAnnouncement,
    WireModel,
)
from protocol.signing import MemoryReplayCache, canonical_json, sign_document, verify_document

log = logging.getLogger("runtime.p2p")

Kind = Literal["policy_version", "relay", "tasks"]
Body = PolicyAnnouncement | RelayAnnouncement | TaskAnnouncement
TOPICS: dict[Kind, str] = {
    "policy_version": "prime-network/policy-versions/v1",
    "relay": "prime-network/relays/v1",
    "tasks": "prime-network/tasks/v1",
}
BODY_MODELS: dict[Kind, type[Body]] = {
    "policy_version": PolicyAnnouncement,
    "relay": RelayAnnouncement,
    "tasks": TaskAnnouncement,
}
KIND_OF_BODY: dict[type[WireModel], Kind] = {model: kind for kind, model in BODY_MODELS.items()}
COORDINATOR_KINDS: frozenset[Kind] = frozenset({"policy_version", "tasks"})
MAX_ANNOUNCEMENT_BYTES = 16 * 1024
MAX_FUTURE_SKEW_S = 10.0
# Refusals no honest peer causes (it checks before forwarding); stale, replayed or out-of-order
# announcements can reach an honest peer through races and clock skew, so they do not count.
HOSTILE_CODES = frozenset({"malformed", "forbidden", "bad_signature", "unsigned"})


HISTORY_NOTE = "heard again: history older than the allowed age"
"""The note on the refusal of an old announcement: a (re)joining node hears such history as a matter of course."""


@dataclass(frozen=True)
class Accepted:
    """An announcement that passed every rule, with its body parsed."""

    kind: Kind
    signer: str
    sent_at: float
    body: Body


def signed_part(announcement: Announcement) -> dict[str, Any]:
    """What the signature covers: the whole announcement but the signature itself."""
    return announcement.model_dump(mode="json", exclude={"signature_b64"})


def sign_announcement(identity: NodeIdentity, body: Body, now: float | None = None) -> Announcement:
    """An announcement of ``body``, signed by ``identity`` and stamped now."""
    unsigned = Announcement(
        kind=KIND_OF_BODY[type(body)],
        body=body.model_dump(mode="json"),
        signer=identity.node_id,
        signature_b64="",
        sent_at=round(time.time() if now is None else now, 3),
    )
    return unsigned.model_copy(update={"signature_b64": sign_document(identity, signed_part(unsigned))})


def encode_announcement(announcement: Announcement) -> bytes:
    return canonical_json(announcement.model_dump(mode="json"))


def manifest_digest(signed: SignedManifest) -> str:
    """The sha256 of a manifest's canonical JSON (named in policy announcements)."""
    return hashlib.sha256(canonical_json(signed.manifest.model_dump(mode="json"))).hexdigest()


def policy_announcement(signed: SignedManifest, origin_url: str | None, published_at: float) -> PolicyAnnouncement:
    return PolicyAnnouncement(
        version=signed.manifest.version,
        manifest_sha256=manifest_digest(signed),
        total_size_bytes=signed.manifest.total_size_bytes,
        origin_url=origin_url,
        published_at=published_at,
    )


class AnnouncementFilter:
    """Decides which gossip a node believes; counts and logs what it drops.

    ``trusted_coordinator_id`` is the pinned coordinator: only it may announce policy versions
    and tasks (None: refuse those kinds, e.g. before the coordinator is known). Thread-safe:
    libp2p calls it from its own thread while the node reads the counters.
    """

    def __init__(
        self,
        trusted_coordinator_id: str | None,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.trusted_coordinator_id = trusted_coordinator_id
        self.max_age_s = max_age_s
        self.clock = clock
        self.num_accepted = 0
        self.num_dropped: Counter[str] = Counter()
        self.num_hostile_by_sender: Counter[str] = Counter()
        """Per forwarding peer: dropped messages that an honest peer would never have sent on."""
        self._replays = MemoryReplayCache()
        self._newest: dict[tuple[Kind, str], float] = {}
        self._lock = threading.Lock()

    def check(self, topic: str, data: bytes) -> Accepted:
        """The parsed announcement, or the PrimeError that says why it is refused."""
        if len(data) > MAX_ANNOUNCEMENT_BYTES:
            raise ProtocolError(f"announcement of {len(data)} bytes is over {MAX_ANNOUNCEMENT_BYTES}")
        try:
            announcement = Announcement.model_validate_json(data)
            body = BODY_MODELS[announcement.kind].model_validate(announcement.body)
        except ValidationError as exc:
            raise ProtocolError(f"malformed announcement: {exc.errors()[0]['msg']}") from exc
        if TOPICS[announcement.kind] != topic:
            raise ProtocolError(f"a {announcement.kind} announcement does not belong on topic {topic}")
        if announcement.kind in COORDINATOR_KINDS and announcement.signer != self.trusted_coordinator_id:
            raise ForbiddenError(
                f"{announcement.kind} announcements are accepted only from the coordinator "
                f"{self.trusted_coordinator_id}, not {announcement.signer}"
            )
        verify_document(announcement.signer, signed_part(announcement), announcement.signature_b64)
        now = self.clock()
        age = now - announcement.sent_at
        if age > self.max_age_s:
            old = StaleTimestampError(f"announcement sent {age:.1f} s ago (allowed: up to {self.max_age_s:.0f} s)")
            old.add_note(HISTORY_NOTE)
            raise old
        if age < -MAX_FUTURE_SKEW_S:
            raise StaleTimestampError(
                f"announcement dated {-age:.1f} s ahead (allowed: up to {MAX_FUTURE_SKEW_S:.0f} s of clock skew)"
            )
        with self._lock:
            signature_id = hashlib.sha256(announcement.signature_b64.encode()).hexdigest()
            if not self._replays.remember(announcement.signer, signature_id, announcement.sent_at + self.max_age_s):
                raise ReplayedNonceError("announcement was already received (replayed)")
            key = (announcement.kind, announcement.signer)
            order = float(body.version) if isinstance(body, PolicyAnnouncement) else announcement.sent_at
            if key in self._newest and order <= self._newest[key]:
                raise ConflictError(f"{announcement.kind} announcement is not newer than the last one accepted")
            self._newest[key] = order
        return Accepted(kind=announcement.kind, signer=announcement.signer, sent_at=announcement.sent_at, body=body)

    def accept(self, topic: str, data: bytes, sender: str = "?") -> Accepted | None:
        """:meth:`check`, with a refusal counted by reason and logged instead of raised."""
        try:
            accepted = self.check(topic, data)
        except PrimeError as exc:
            with self._lock:
                self.num_dropped[exc.code] += 1
                if exc.code in HOSTILE_CODES:
                    self.num_hostile_by_sender[sender] += 1
            # history a (re)joining node hears again, and duplicates, are the normal life of gossip: debug only
            history = HISTORY_NOTE in getattr(exc, "__notes__", ())
            level = logging.DEBUG if history or isinstance(exc, ConflictError | ReplayedNonceError) else logging.WARNING
            log.log(level, "dropped gossip from %s on %s (%s): %s", sender, topic, exc.code, exc.message)
            return None
        except Exception as exc:  # never let one message take the node down
            with self._lock:
                self.num_dropped["internal"] += 1
            log.warning("dropped gossip from %s on %s (internal): %r", sender, topic, exc)
            return None
        with self._lock:
            self.num_accepted += 1
        return accepted
