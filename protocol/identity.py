"""Node identities: one Ed25519 key pair per node, its node id, and its libp2p peer id.

The key is generated on first use and stored as a PKCS#8 PEM file with 0600 permissions in
the node's data dir; a key file that others can read is refused rather than trusted. The node
id *is* the libp2p peer id of the key (``12D3KooW...``): an identity multihash of the
protobuf-encoded public key, base58btc-encoded. One string therefore names the node on the
ledger, in signatures and on the p2p layer, and the public key can be recovered from it
without a lookup.
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import BadSignatureError, IdentityError, KeyPermissionError

KEY_FILE_NAME = "node_key.pem"
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
# libp2p crypto.proto: PublicKey{Type=Ed25519(1), Data=<32 bytes>}, then an identity multihash of it.
_PROTO_ED25519_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])
_IDENTITY_MULTIHASH_PREFIX = bytes([0x00, len(_PROTO_ED25519_PREFIX) + 32])


def _b58encode(data: bytes) -> str:
    num = int.from_bytes(data, "big")
    out = ""
    while num:
        num, rem = divmod(num, 58)
        out = _B58_ALPHABET[rem] + out
    leading_zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * leading_zeros + out


def _b58decode(text: str) -> bytes:
    num = 0
    for char in text:
        index = _B58_ALPHABET.find(char)
        if index < 0:
            raise ValueError(f"invalid base58 character {char!r}")
        num = num * 58 + index
    body = num.to_bytes((num.bit_length() + 7) // 8, "big") if num else b""
    leading_ones = len(text) - len(text.lstrip("1"))
    return b"\0" * leading_ones + body


def node_id_from_public_key(public_key: Ed25519PublicKey) -> str:
    """The node id (= libp2p peer id) of an Ed25519 public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _b58encode(_IDENTITY_MULTIHASH_PREFIX + _PROTO_ED25519_PREFIX + raw)


@functools.lru_cache(maxsize=8192)  # every signed request decodes its signer's id; keys are immutable
def public_key_from_node_id(node_id: str) -> Ed25519PublicKey:
    """Recover the Ed25519 public key from a node id; IdentityError when it is not one."""
    try:
        decoded = _b58decode(node_id)
    except ValueError as exc:
        raise IdentityError(f"node id {node_id[:60]!r} is not base58: {exc}") from exc
    prefix = _IDENTITY_MULTIHASH_PREFIX + _PROTO_ED25519_PREFIX
    if len(decoded) != len(prefix) + 32 or not decoded.startswith(prefix):
        raise IdentityError(f"node id {node_id[:60]!r} is not an Ed25519 libp2p peer id")
    return Ed25519PublicKey.from_public_bytes(decoded[len(prefix) :])


def verify_signature(node_id: str, message: bytes, signature: bytes) -> None:
    """Check ``signature`` over ``message`` by the node ``node_id``; BadSignatureError if not."""
    public_key = public_key_from_node_id(node_id)
    try:
        public_key.verify(signature, message)
    except InvalidSignature as exc:
        raise BadSignatureError(f"signature does not verify for node {node_id}") from exc


@dataclass(frozen=True)
class NodeIdentity:
    """A node's key pair and the ids derived from it."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> NodeIdentity:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def node_id(self) -> str:
        return node_id_from_public_key(self.public_key)

    @property
    def public_key_bytes(self) -> bytes:
        return self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def private_key_bytes(self) -> bytes:
        """The raw 32-byte seed (what libp2p's Ed25519 key pair is built from)."""
        return self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def to_pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @classmethod
    def from_pem(cls, data: bytes, source: str = "<memory>") -> NodeIdentity:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"{source} is not a PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"{source} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)


def key_path(data_dir: Path) -> Path:
    return data_dir / KEY_FILE_NAME


def load_identity(path: Path) -> NodeIdentity:
    """Read a node key, refusing one whose file others can read or write."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        raise IdentityError(f"no node key at {path}; run with --data-dir pointing at the node's data dir") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyPermissionError(
            f"node key {path} has permissions {stat.S_IMODE(mode):04o}; others could read it. "
            f"Run `chmod 600 {path}` if you trust it, or delete it to make a new identity."
        )
    return NodeIdentity.from_pem(path.read_bytes(), source=str(path))


def _write_private(identity: NodeIdentity, path: Path) -> Path:
    """A fresh file beside ``path`` holding the key, created 0600 from the start; its name is this writer's own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, identity.to_pem())
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def save_identity(identity: NodeIdentity, path: Path) -> None:
    """Write a key file created 0600 from the start (never world-readable, even briefly), replacing any."""
    os.replace(_write_private(identity, path), path)


def load_or_create_identity(data_dir: Path) -> NodeIdentity:
    """The node's identity: loaded from ``data_dir`` or generated and stored there on first use.

    Processes that start at once on one data dir (a SLURM array sharing a folder, a restart racing
    the old process) end with one identity: the key is linked into place only if none is there yet,
    and whoever loses that race loads the winner's key instead of overwriting it.
    """
    path = key_path(data_dir)
    if path.exists():
        return load_identity(path)
    identity = NodeIdentity.generate()
    tmp = _write_private(identity, path)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return load_identity(path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        os.replace(tmp, path)  # a filesystem without hard links: last writer wins, as before
        return load_identity(path)
    finally:
        tmp.unlink(missing_ok=True)
    return identity
