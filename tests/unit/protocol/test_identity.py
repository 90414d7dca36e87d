"""Node identities: creation, 0600 storage, refusal of loose permissions, peer-id compatibility."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol.errors import BadSignatureError, IdentityError, KeyPermissionError
from protocol.identity import (
    NodeIdentity,
    key_path,
    load_identity,
    load_or_create_identity,
    public_key_from_node_id,
    save_identity,
    verify_signature,
)


def test_key_created_on_first_use_with_0600_and_loaded_after(tmp_path: Path) -> None:
    first = load_or_create_identity(tmp_path / "node")
    path = key_path(tmp_path / "node")
    assert path.stat().st_mode & 0o777 == 0o600
    second = load_or_create_identity(tmp_path / "node")
    assert second.node_id == first.node_id
    assert second.public_key_bytes == first.public_key_bytes


def test_a_node_starting_beside_another_keeps_the_key_that_won(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another process creates the key between this one's look and its write (two SLURM array
    # tasks on one data dir): both must end with that key, and no temporary file may be left.
    winner = NodeIdentity.generate()
    generate = NodeIdentity.generate

    def generate_while_another_process_saves() -> NodeIdentity:
        save_identity(winner, key_path(tmp_path))
        return generate()

    monkeypatch.setattr(NodeIdentity, "generate", staticmethod(generate_while_another_process_saves))
    assert load_or_create_identity(tmp_path).node_id == winner.node_id
    assert load_identity(key_path(tmp_path)).node_id == winner.node_id
    assert [p.name for p in tmp_path.iterdir()] == [key_path(tmp_path).name]


def test_key_created_0600_even_with_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        load_or_create_identity(tmp_path)
    finally:
        os.umask(old)
    assert key_path(tmp_path).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_with_loose_permissions_is_refused(tmp_path: Path, mode: int) -> None:
    load_or_create_identity(tmp_path)
    key_path(tmp_path).chmod(mode)
    with pytest.raises(KeyPermissionError, match=r"chmod 600"):
        load_or_create_identity(tmp_path)


def test_garbage_key_file_is_a_clear_error(tmp_path: Path) -> None:
    path = key_path(tmp_path)
    path.write_bytes(b"not a key")
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="not a PEM private key"):
        load_identity(path)


def test_node_id_round_trips_to_public_key() -> None:
    identity = NodeIdentity.generate()
    assert identity.node_id.startswith("12D3KooW")
    recovered = public_key_from_node_id(identity.node_id)
    assert recovered.public_bytes_raw() == identity.public_key_bytes


def test_node_id_equals_libp2p_peer_id() -> None:
    from libp2p.crypto.ed25519 import Ed25519PrivateKey as Libp2pPrivateKey
    from libp2p.peer.id import ID

    identity = NodeIdentity.generate()
    libp2p_key = Libp2pPrivateKey.from_bytes(identity.private_key_bytes)
    assert ID.from_pubkey(libp2p_key.get_public_key()).to_base58() == identity.node_id


@pytest.mark.parametrize("bad", ["", "hello", "0OIl", "12D3KooW" + "1" * 44])
def test_invalid_node_ids_are_refused(bad: str) -> None:
    with pytest.raises(IdentityError):
        public_key_from_node_id(bad)


def test_signature_by_another_key_is_refused() -> None:
    alice, mallory = NodeIdentity.generate(), NodeIdentity.generate()
    verify_signature(alice.node_id, b"msg", alice.sign(b"msg"))
    with pytest.raises(BadSignatureError):
        verify_signature(alice.node_id, b"msg", mallory.sign(b"msg"))
