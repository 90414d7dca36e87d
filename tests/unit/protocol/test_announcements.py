"""The rules gossip announcements are accepted by: signer, signature, shape, topic, age, replay, order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.announcements import (
    MAX_ANNOUNCEMENT_BYTES,
    TOPICS,
    AnnouncementFilter,
    encode_announcement,
    manifest_digest,
    sign_announcement,
)
from protocol.errors import PrimeError
from protocol.identity import NodeIdentity
from protocol.schemas import PolicyAnnouncement, RelayAnnouncement, TaskAnnouncement

NOW = 1_800_000_000.0
COORDINATOR = NodeIdentity.generate()
STRANGER = NodeIdentity.generate()
POLICY_TOPIC = TOPICS["policy_version"]


def policy(version: int) -> PolicyAnnouncement:
    return PolicyAnnouncement(
        version=version,
        manifest_sha256="ab" * 32,
        total_size_bytes=1234,
        origin_url="http://127.0.0.1:8000/shardcast",
        published_at=NOW,
    )


def gate(max_age_s: float = 60.0) -> AnnouncementFilter:
    return AnnouncementFilter(COORDINATOR.node_id, max_age_s=max_age_s, clock=lambda: NOW)


def signed(identity: NodeIdentity, body: Any, sent_at: float = NOW) -> bytes:
    return encode_announcement(sign_announcement(identity, body, now=sent_at))


def refusal(filter_: AnnouncementFilter, topic: str, data: bytes) -> str:
    with pytest.raises(PrimeError) as caught:
        filter_.check(topic, data)
    return caught.value.code


def test_coordinator_policy_announcement_is_accepted_with_its_body() -> None:
    accepted = gate().check(POLICY_TOPIC, signed(COORDINATOR, policy(3)))
    assert accepted.kind == "policy_version"
    assert accepted.signer == COORDINATOR.node_id
    assert accepted.body == policy(3)


def test_policy_or_tasks_signed_by_another_key_are_forbidden() -> None:
    tasks = TaskAnnouncement(num_tasks_open=5, current_policy_version=1)
    assert refusal(gate(), POLICY_TOPIC, signed(STRANGER, policy(3))) == "forbidden"
    assert refusal(gate(), TOPICS["tasks"], signed(STRANGER, tasks)) == "forbidden"
    no_coordinator = AnnouncementFilter(None, clock=lambda: NOW)
    assert refusal(no_coordinator, POLICY_TOPIC, signed(COORDINATOR, policy(3))) == "forbidden"


def test_claiming_the_coordinator_as_signer_without_its_key_fails_the_signature() -> None:
    forged = json.loads(signed(STRANGER, policy(3)))
    forged["signer"] = COORDINATOR.node_id
    assert refusal(gate(), POLICY_TOPIC, json.dumps(forged).encode()) == "bad_signature"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda doc: doc["body"].update(version=4),
        lambda doc: doc["body"].update(origin_url="http://evil.example/shardcast"),
        lambda doc: doc.update(sent_at=doc["sent_at"] + 1),
        lambda doc: doc.update(signature_b64="AAAA"),
        lambda doc: doc.update(signature_b64="not base64!"),
        lambda doc: doc.update(signature_b64=""),
    ],
)
def test_any_change_after_signing_breaks_the_signature(tamper: Any) -> None:
    document = json.loads(signed(COORDINATOR, policy(3)))
    tamper(document)
    assert refusal(gate(), POLICY_TOPIC, json.dumps(document).encode()) == "bad_signature"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe not json",
        b"[]",
        b'{"kind": "policy_version"}',
        json.dumps({"v": 1, "kind": "weights", "body": {}, "signer": "x", "signature_b64": "", "sent_at": 1}).encode(),
    ],
)
def test_malformed_bytes_are_refused(data: bytes) -> None:
    assert refusal(gate(), POLICY_TOPIC, data) == "malformed"


def test_a_signed_body_of_the_wrong_shape_is_malformed() -> None:
    document = json.loads(signed(COORDINATOR, policy(3)))
    for body in ({"version": -1}, {**document["body"], "extra": 1}, {**document["body"], "manifest_sha256": "xyz"}):
        assert refusal(gate(), POLICY_TOPIC, json.dumps({**document, "body": body}).encode()) == "malformed"


def test_an_announcement_on_another_kinds_topic_is_refused() -> None:
    assert refusal(gate(), TOPICS["relay"], signed(COORDINATOR, policy(3))) == "malformed"


def test_oversize_messages_are_refused_before_parsing() -> None:
    assert refusal(gate(), POLICY_TOPIC, b" " * (MAX_ANNOUNCEMENT_BYTES + 1)) == "malformed"


def test_stale_and_future_announcements_are_refused() -> None:
    assert refusal(gate(max_age_s=30), POLICY_TOPIC, signed(COORDINATOR, policy(3), sent_at=NOW - 31)) == (
        "stale_timestamp"
    )
    assert refusal(gate(), POLICY_TOPIC, signed(COORDINATOR, policy(3), sent_at=NOW + 60)) == "stale_timestamp"
    assert gate(max_age_s=30).check(POLICY_TOPIC, signed(COORDINATOR, policy(3), sent_at=NOW - 29)).body == policy(3)


def test_a_replayed_announcement_is_refused() -> None:
    filter_ = gate()
    data = signed(COORDINATOR, policy(3))
    filter_.check(POLICY_TOPIC, data)
    assert refusal(filter_, POLICY_TOPIC, data) == "replayed_nonce"


def test_policy_versions_must_move_forward() -> None:
    filter_ = gate()
    filter_.check(POLICY_TOPIC, signed(COORDINATOR, policy(5)))
    assert refusal(filter_, POLICY_TOPIC, signed(COORDINATOR, policy(4), sent_at=NOW + 1)) == "conflict"
    assert refusal(filter_, POLICY_TOPIC, signed(COORDINATOR, policy(5), sent_at=NOW + 1)) == "conflict"
    assert filter_.check(POLICY_TOPIC, signed(COORDINATOR, policy(6))).body == policy(6)


def test_relays_announce_themselves_with_their_own_key_newest_first() -> None:
    filter_ = gate()
    relay = RelayAnnouncement(url="http://10.0.0.7:8100", latest_version=2)
    accepted = filter_.check(TOPICS["relay"], signed(STRANGER, relay))
    assert (accepted.signer, accepted.body) == (STRANGER.node_id, relay)
    moved = RelayAnnouncement(url="http://10.0.0.8:8100", latest_version=3)
    assert refusal(filter_, TOPICS["relay"], signed(STRANGER, moved, sent_at=NOW - 5)) == "conflict"
    assert filter_.check(TOPICS["relay"], signed(STRANGER, moved, sent_at=NOW + 5)).body == moved
    assert filter_.check(TOPICS["relay"], signed(COORDINATOR, relay)).signer == COORDINATOR.node_id


def test_accept_counts_and_logs_drops_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    filter_ = gate()
    assert filter_.accept(POLICY_TOPIC, b"\x00garbage", sender="peer-a") is None
    assert filter_.accept(POLICY_TOPIC, signed(STRANGER, policy(9)), sender="peer-b") is None
    assert filter_.accept(POLICY_TOPIC, signed(COORDINATOR, policy(1))) is not None
    assert filter_.accept(POLICY_TOPIC, signed(COORDINATOR, policy(1), sent_at=NOW + 1)) is None
    assert filter_.num_accepted == 1
    assert filter_.num_dropped == {"malformed": 1, "forbidden": 1, "conflict": 1}
    assert filter_.num_hostile_by_sender == {"peer-a": 1, "peer-b": 1}  # an out-of-order repeat is no offence
    assert "dropped gossip from peer-b" in caplog.text and "forbidden" in caplog.text


def test_manifest_digest_covers_the_manifest_canonical_json() -> None:
    from protocol.schemas import PolicyManifest, SignedManifest

    manifest = PolicyManifest(
        version=1,
        created_at=NOW,
        hash_algorithm="blake3",
        shard_size_bytes=4096,
        total_size_bytes=0,
        files=[],
        shards=[],
    )
    one = SignedManifest(manifest=manifest, signer=COORDINATOR.node_id, signature_b64="x")
    other = SignedManifest(
        manifest=manifest.model_copy(update={"version": 2}), signer=COORDINATOR.node_id, signature_b64="x"
    )
    assert len(manifest_digest(one)) == 64 and manifest_digest(one) != manifest_digest(other)


def test_advertised_addrs_name_the_public_host() -> None:
    from runtime.p2p.gossip import advertised_addr

    bound = f"/ip4/0.0.0.0/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(bound, None) == bound
    assert advertised_addr(bound, "203.0.113.7") == f"/ip4/203.0.113.7/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(bound, "2001:db8::1") == f"/ip6/2001:db8::1/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(bound, "coord.example.org") == f"/dns/coord.example.org/tcp/4001/p2p/{COORDINATOR.node_id}"


def test_a_wildcard_bind_is_advertised_as_the_host_the_asker_reached() -> None:
    """Bound to 0.0.0.0 with no public_host, the coordinator named 0.0.0.0, which every other machine dials as
    itself; it now names the host the asker reached the API by (an explicit public_host still wins)."""
    from runtime.p2p.gossip import advertised_addr

    bound = f"/ip4/0.0.0.0/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(bound, None, "10.200.1.2") == f"/ip4/10.200.1.2/tcp/4001/p2p/{COORDINATOR.node_id}"
    named = advertised_addr(bound, None, "coord.example.org")
    assert named == f"/dns/coord.example.org/tcp/4001/p2p/{COORDINATOR.node_id}"
    bound6 = f"/ip6/::/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(bound6, None, "2001:db8::1") == f"/ip6/2001:db8::1/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(bound, "203.0.113.7", "10.200.1.2") == f"/ip4/203.0.113.7/tcp/4001/p2p/{COORDINATOR.node_id}"
    specific = f"/ip4/10.0.0.5/tcp/4001/p2p/{COORDINATOR.node_id}"
    assert advertised_addr(specific, None, "10.200.1.2") == specific  # a real bind address is kept
    for junk in ("", "bad host/../x", "a" * 300, None):
        assert advertised_addr(bound, None, junk) == bound  # a Host header that is no host name changes nothing


def test_replayed_history_is_logged_at_debug_and_future_dates_warn(caplog: pytest.LogCaptureFixture) -> None:
    """A (re)joining node hears the last minutes of announcements again: that is no warning, a future date is."""
    import logging

    filter_ = gate()
    with caplog.at_level(logging.DEBUG, logger="runtime.p2p"):
        assert filter_.accept(POLICY_TOPIC, signed(COORDINATOR, policy(3), sent_at=NOW - 3600), sender="p") is None
        assert filter_.accept(POLICY_TOPIC, signed(COORDINATOR, policy(4), sent_at=NOW + 3600), sender="p") is None
    levels = [(record.levelno, "ahead" in record.getMessage()) for record in caplog.records]
    assert levels == [(logging.DEBUG, False), (logging.WARNING, True)]
    assert filter_.num_dropped == {"stale_timestamp": 2}
