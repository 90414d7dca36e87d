"""Policy versions on a node's disk (worker or validator): download once through SHARDCAST, prefetch, prune.

Each version is fetched from the relays by :func:`shardcast.client.fetch_version`, which
verifies every shard against the manifest signed by the coordinator and exposes the version
atomically. Concurrent asks for one version share one download; a failed prefetch is only
logged (the task that needs the version will try again and report the error).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from shardcast.client import fetch_version, version_path
from shardcast.transfer import TransferOptions

log = logging.getLogger(__name__)


class WeightsCache:
    """Downloads, caches and prunes policy versions for one worker."""

    def __init__(
        self,
        relays: Sequence[str],
        coordinator_id: str,
        dest_root: Path,
        keep_versions: int = 3,
        options: TransferOptions | None = None,
    ) -> None:
        self.relays = list(relays)
        self.coordinator_id = coordinator_id
        self.dest_root = dest_root
        self.keep_versions = keep_versions
        self.options = options
        self._downloads: dict[int, asyncio.Task[Path]] = {}

    def held_versions(self) -> list[int]:
        """Versions fully on disk (as the heartbeat reports them)."""
        if not self.dest_root.is_dir():
            return []
        held = []
        for path in self.dest_root.glob("v*"):
            if path.is_dir() and path.name[1:].isdigit():
                held.append(int(path.name[1:]))
        return sorted(held)

    def _start(self, version: int) -> asyncio.Task[Path]:
        """The download of ``version``: the one running or done, or a new one after a failure."""
        task = self._downloads.get(version)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.create_task(self._download(version))
            task.add_done_callback(self._log_failure)
            self._downloads[version] = task
        return task

    async def ensure(self, version: int) -> Path:
        """The directory of ``version``, downloading it first if needed."""
        return await asyncio.shield(self._start(version))

    def prefetch(self, version: int) -> None:
        """Start downloading ``version`` in the background if it is not there yet."""
        self._start(version)

    @staticmethod
    def _log_failure(task: asyncio.Task[Path]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.debug("download failed: %s", task.exception())

    async def _download(self, version: int) -> Path:
        path = await fetch_version(version, self.relays, self.coordinator_id, self.dest_root, self.options)
        self.prune(keep_at_least=version)
        return path

    def prune(self, keep_at_least: int) -> None:
        """Remove versions older than the newest ``keep_versions``, never ``keep_at_least`` or newer."""
        held = self.held_versions()
        for version in held[: max(0, len(held) - self.keep_versions)]:
            if version < keep_at_least:
                shutil.rmtree(version_path(self.dest_root, version), ignore_errors=True)
                self._downloads.pop(version, None)

    async def aclose(self) -> None:
        for task in self._downloads.values():
            task.cancel()
        await asyncio.gather(*self._downloads.values(), return_exceptions=True)
