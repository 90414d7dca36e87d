"""The on-disk layout of versions that an origin or a relay serves, and its atomic operations.

::

    root/
      v{N}/manifest.json    the signed manifest, byte for byte what is served
      v{N}/files/...        origin: the checkpoint's files (shards are served from their spans)
      v{N}/shards/{i}       relay: shard i (only ever present once complete and verified)
      .staging/             versions (origin) and shards (relay) still being written
      .trash/               versions being deleted
      .publish.lock         origin: held by the one process publishing (flock)
      announced             origin: the version currently announced (never pruned)

Every change appears at once or not at all: a version is written under ``.staging`` and
renamed into place; a shard is written as ``.staging/...part`` and renamed once verified;
a pruned version is renamed into ``.trash`` before it is deleted. A reader therefore never
sees a half-written version or shard, and a file it already opened stays readable (POSIX
keeps unlinked files alive while open). A publisher holds ``.publish.lock``; whoever takes it
knows that anything left in ``.staging`` or ``.trash`` belongs to a process that died, and
removes it (:meth:`VersionStore.publishing`, :meth:`VersionStore.clear_leftovers_if_idle`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from protocol.errors import LocalFaultError

_VERSION_DIR = re.compile(r"^v(\d{1,18})$")
MANIFEST_NAME = "manifest.json"
ANNOUNCED_NAME = "announced"
PUBLISH_LOCK_NAME = ".publish.lock"


@contextmanager
def local_disk(doing: str) -> Iterator[None]:
    """Report an OSError from the file operations inside as a :class:`LocalFaultError` saying ``doing``.

    Wrap local file work only, never a network call (socket errors are OSErrors too): a local
    fault must stop the work with advice, not be retried as if a remote had failed.
    """
    try:
        yield
    except OSError as exc:
        raise LocalFaultError.from_os_error(exc, doing) from exc


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset``. ``os.pwrite`` may write less than asked (a disk filling
    up does exactly that) and say so only in its return value; the rest is retried, so a full disk
    ends in ENOSPC instead of a silently truncated file."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (durable, all or nothing)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def fsync_file(path: Path) -> None:
    """Flush a written file's bytes to disk."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def versions_to_prune(held: Iterable[int], keep: int, protected: Iterable[int]) -> list[int]:
    """The versions to delete so that the newest ``keep`` remain, never touching ``protected``."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    newest_first = sorted(set(held), reverse=True)
    guarded = set(protected)
    return sorted(version for version in newest_first[keep:] if version not in guarded)


class VersionStore:
    """A directory of versions; all methods are synchronous file operations."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = root / ".staging"
        self.trash = root / ".trash"
        for path in (root, self.staging, self.trash):
            path.mkdir(parents=True, exist_ok=True)

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    def manifest_path(self, version: int) -> Path:
        return self.version_dir(version) / MANIFEST_NAME

    def shard_path(self, version: int, index: int) -> Path:
        return self.version_dir(version) / "shards" / str(index)

    def versions(self) -> list[int]:
        """Versions whose directory is in place (complete for an origin), oldest first."""
        found = []
        for entry in os.scandir(self.root):
            match = _VERSION_DIR.match(entry.name)
            if match and entry.is_dir():
                found.append(int(match.group(1)))
        return sorted(found)

    def new_staging_dir(self, label: str) -> Path:
        path = self.staging / f"{label}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path

    def remove_staging(self, staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)

    def install_version(self, staged: Path, version: int) -> None:
        """Rename a fully written staging directory into place as version ``version``."""
        target = self.version_dir(version)
        if target.exists():
            raise FileExistsError(f"version {version} already exists in {self.root}")
        os.rename(staged, target)
        fsync_dir(self.root)

    def remove_version(self, version: int) -> None:
        """Take a version out of view at once, then delete its bytes."""
        source = self.version_dir(version)
        doomed = self.trash / f"v{version}-{uuid.uuid4().hex[:12]}"
        try:
            os.rename(source, doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def prune(self, keep: int, protected: Iterable[int] = ()) -> list[int]:
        """Delete all but the newest ``keep`` versions (and never a protected one); returns those removed."""
        doomed = versions_to_prune(self.versions(), keep, protected)
        for version in doomed:
            self.remove_version(version)
        return doomed

    def clear_leftovers(self) -> None:
        """Remove staging and trash contents left by a process that died mid-write."""
        for folder in (self.staging, self.trash):
            for entry in folder.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    @contextmanager
    def publishing(self) -> Iterator[None]:
        """Be the one publisher of this store (others wait); first clear what a killed one left."""
        with open(self.root / PUBLISH_LOCK_NAME, "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                self.clear_leftovers()
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def clear_leftovers_if_idle(self) -> bool:
        """Clear a killed publisher's staging and trash unless a publish is running now; True if cleared."""
        with open(self.root / PUBLISH_LOCK_NAME, "a") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            try:
                self.clear_leftovers()
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return True

    def announced(self) -> int | None:
        try:
            return int((self.root / ANNOUNCED_NAME).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def announce(self, version: int) -> None:
        write_file_atomically(self.root / ANNOUNCED_NAME, f"{version}\n".encode())
