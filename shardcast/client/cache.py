"""Policy versions on a node's disk (worker or validator): download once through SHARDCAST, prefetch, prune.

Each version is fetched from the relays by :func:`shardcast.client.download.fetch_version`, which
verifies every shard against the manifest signed by the coordinator and exposes the version
atomically. Concurrent asks for one version share one download; a failed download is logged
once per version and kind of failure, at warning (a version on no relay yet, which every prefetch
of the next version meets, at debug) (the task that needs the version will try again
and report the error). A version refused for good (:class:`~protocol.errors.VersionRefusedError`:
its signed patch does not rebuild its checkpoint) is remembered: asking for it again raises the
same error at once, and it is never downloaded again by this cache.

A version in use is never removed: whoever needs one on disk (an engine that loads or serves
it, a leased task, an audit) pins it with :meth:`WeightsCache.pin` or :meth:`WeightsCache.pinned`
and unpins it when done. Pruning keeps the newest ``keep_versions`` and every pinned version;
it runs after each download and whenever the last pin of a version is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from protocol.errors import NotFoundError, PrimeError, VersionRefusedError
from shardcast.client.download import fetch_version, version_path
from shardcast.client.transfer import TransferOptions
from shardcast.format.store import versions_to_prune

log = logging.getLogger(__name__)


class WeightsCache:
    """Downloads, caches and prunes policy versions for one worker or validator."""

    def __init__(
        self,
        relays: Sequence[str],
        coordinator_id: str,
        dest_root: Path,
        keep_versions: int = 3,
        options: TransferOptions | None = None,
        run_name: str | None = None,
    ) -> None:
        self.relays = list(relays)
        self.run_name = run_name
        """The run whose versions these are (manifests of other runs are refused); None: any."""
        self.coordinator_id = coordinator_id
        self.dest_root = dest_root
        self.keep_versions = keep_versions
        self.options = options
        self._downloads: dict[int, asyncio.Task[Path]] = {}
        self._pins: Counter[int] = Counter()
        self.refused: dict[int, VersionRefusedError] = {}
        """Versions refused for good, with why: never fetched again."""
        self._failures_logged: set[tuple[int, str]] = set()

    def held_versions(self) -> list[int]:
        """Versions fully on disk (as the heartbeat reports them)."""
        if not self.dest_root.is_dir():
            return []
        held = []
        for path in self.dest_root.glob("v*"):
            if path.is_dir() and path.name[1:].isdigit():
                held.append(int(path.name[1:]))
        return sorted(held)

    def pin(self, version: int) -> None:
        """Keep ``version`` on disk until a matching :meth:`unpin` (pins of one version add up)."""
        self._pins[version] += 1

    def unpin(self, version: int) -> None:
        """Release one pin of ``version``; the last one lets pruning remove it."""
        if self._pins[version] <= 0:
            raise ValueError(f"policy v{version} is not pinned")
        self._pins[version] -= 1
        if self._pins[version] == 0:
            del self._pins[version]
            self.prune()

    @contextlib.contextmanager
    def pinned(self, *versions: int) -> Iterator[None]:
        """Pin ``versions`` for the duration of a ``with`` block."""
        for version in versions:
            self.pin(version)
        try:
            yield
        finally:
            for version in versions:
                self.unpin(version)

    def in_use(self) -> set[int]:
        """The versions pruning must not touch: pinned ones."""
        return set(self._pins)

    def _start(self, version: int) -> asyncio.Task[Path]:
        """The download of ``version``: the one running or done, or a new one after a failure."""
        task = self._downloads.get(version)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.create_task(self._download(version))
            task.add_done_callback(functools.partial(self._log_failure, version))
            self._downloads[version] = task
        return task

    async def ensure(self, version: int) -> Path:
        """The directory of ``version``, downloading it first if needed; a refused version raises at once.

        A caller that goes on to read the directory pins the version first (see :meth:`pinned`).
        """
        if version in self.refused:
            raise self.refused[version]
        return await asyncio.shield(self._start(version))

    def prefetch(self, version: int) -> None:
        """Start downloading ``version`` in the background if it is not there yet (nor refused)."""
        if version not in self.refused:
            self._start(version)

    def _log_failure(self, version: int, task: asyncio.Task[Path]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        kind = error.code if isinstance(error, PrimeError) else type(error).__name__
        if isinstance(error, NotFoundError):  # a prefetch of a version not published (or mirrored) yet: normal
            log.debug("policy v%d is not on a relay yet: %s", version, error.message)
            return
        if (version, kind) in self._failures_logged:
            log.debug("download of policy v%d failed again: %s", version, error)
            return
        self._failures_logged.add((version, kind))
        log.warning("download of policy v%d failed: %s", version, getattr(error, "message", error))

    async def _download(self, version: int) -> Path:
        try:
            path = await fetch_version(
                version, self.relays, self.coordinator_id, self.dest_root, self.options, run_name=self.run_name
            )
        except VersionRefusedError as exc:
            self.refused[version] = exc
            raise
        self.prune(also_keep=version)  # the asker has not pinned it yet if it was old: let it have it
        return path

    def prune(self, also_keep: int | None = None) -> list[int]:
        """Remove versions beyond the newest ``keep_versions``, never a pinned one (nor ``also_keep``).

        Returns the versions removed.
        """
        protected = self.in_use() | ({also_keep} if also_keep is not None else set())
        doomed = versions_to_prune(self.held_versions(), self.keep_versions, protected)
        for version in doomed:
            shutil.rmtree(version_path(self.dest_root, version), ignore_errors=True)
            self._downloads.pop(version, None)
        if doomed:
            log.debug("pruned policy version(s) %s (in use: %s)", doomed, sorted(self.in_use()))
        return doomed

    async def aclose(self) -> None:
        for task in self._downloads.values():
            task.cancel()
        await asyncio.gather(*self._downloads.values(), return_exceptions=True)
