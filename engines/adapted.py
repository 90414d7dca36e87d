"""One LoRA run's policy as an engine of its own, over a base engine that other policies may share.

A LoRA run's version 0 is its base model and every later version an adapter (engines/adapters.py).
:class:`AdapterView` is what a task loop, an eval or a validator's audit uses in place of an engine:
it generates (and prefills) with its adapter, under its own name on the shared base engine, and
"loads a version" by loading that version's adapter in place (the base's own directory: the base
alone, no adapter). Several views on one base engine serve several runs, or several versions of one
run, with one copy of the base in memory. The base engine's lock serializes their use of the model.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from engines.adapters import is_adapter_dir
from engines.base import Engine, GenerationRequest, GenerationResult, PrefillResult
from environments.images import Image

_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def _lock_of(base: Engine) -> threading.RLock:
    """The one lock of every view on ``base`` (an engine is used by one thread at a time)."""
    with _LOCKS_LOCK:
        lock = _LOCKS.get(base)
        if lock is None:
            lock = _LOCKS[base] = threading.RLock()
        return lock


class AdapterView:
    """The policy ``adapter`` names on ``base`` (the base alone until an adapter version is loaded)."""

    def __init__(self, base: Engine, adapter: str) -> None:
        self.base = base
        self.adapter = adapter
        self.serving_adapter = False
        """Whether the last version loaded was an adapter (else the view serves the base alone)."""
        self._lock = _lock_of(base)

    @property
    def name(self) -> Literal["vllm", "hf"]:
        return self.base.name

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    def _active(self) -> str | None:
        return self.adapter if self.serving_adapter else None

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        adapter = self._active()
        with self._lock:
            return self.base.generate([replace(request, adapter=adapter) for request in requests])

    def prefill(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None = None,
        images: list[tuple[Image, ...]] | None = None,
    ) -> list[PrefillResult]:
        """Prefill with this view's adapter (``adapter`` is ignored: the view is one policy)."""
        engine: Any = self.base
        with self._lock:
            results: list[PrefillResult] = engine.prefill(prompts, completions, self._active(), images)
        return results

    def load_weights(self, checkpoint_dir: Path) -> None:
        """Serve the version in ``checkpoint_dir``: an adapter is loaded in place under this view's name; the base's
        own directory (version 0) means the base alone, which the base engine already holds."""
        with self._lock:
            if is_adapter_dir(Path(checkpoint_dir)):
                self.base.load_adapter(self.adapter, Path(checkpoint_dir))
                self.serving_adapter = True
            else:
                self.serving_adapter = False

    def load_adapter(self, name: str, adapter_dir: Path) -> None:
        with self._lock:
            self.base.load_adapter(name, adapter_dir)

    def remove_adapter(self, name: str) -> None:
        with self._lock:
            self.base.remove_adapter(name)

    def close(self) -> None:
        """Forget this view's adapter; the base engine stays for the others (its owner closes it)."""
        with self._lock:
            self.base.remove_adapter(self.adapter)
            self.serving_adapter = False
