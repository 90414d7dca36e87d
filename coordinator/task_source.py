"""Where the ledger gets prompts: a small pluggable interface, loaded from `task_source` in the config.

A :class:`TaskSource` turns (task name, group index, number of prompts) into prompts. It must be
deterministic: after a restart the ledger may ask again for a group it already handed out and
must get the same prompts. The trainer's built-in tasks plug in through an adapter that
implements these two methods; ``task_source = "module:attribute"`` names it (an instance, or a
zero-argument factory returning one). With no source configured the ledger runs but has no
work to hand out.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from protocol.errors import ConfigError


@dataclass(frozen=True)
class SourcePrompt:
    token_ids: tuple[int, ...]
    """The prompt as the policy's tokenizer encodes it (authoritative)."""
    text: str
    """The same prompt for people (dashboards, logs)."""
    example_index: int | None = None
    """The example's index in the task's generator, when it has one (validators recompute rewards from it)."""


@runtime_checkable
class TaskSource(Protocol):
    def has_task(self, task_name: str) -> bool:
        """Whether this source can produce prompts for ``task_name``."""
        ...

    def prompt_group(self, task_name: str, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        """The prompts of group ``group_index``; the same arguments always give the same prompts."""
        ...


class EmptyTaskSource:
    """The source used when none is configured: knows every task name, produces nothing."""

    def has_task(self, task_name: str) -> bool:
        return True

    def prompt_group(self, task_name: str, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        return ()


def load_task_source(spec: str) -> TaskSource:
    """The source named by ``module:attribute`` (an instance or a zero-argument factory); empty: none."""
    if not spec:
        return EmptyTaskSource()
    module_name, _, attribute = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"task_source {spec!r} cannot be loaded ({exc}); install the package that provides it "
            "(pip install ...) or fix task_source (module:attribute)"
        ) from exc
    is_instance = isinstance(found, TaskSource) and not isinstance(found, type)
    source = found if is_instance or not callable(found) else found()
    if not isinstance(source, TaskSource):
        raise ConfigError(f"task_source {spec!r} is not a TaskSource (needs has_task and prompt_group)")
    return source
