"""Tasks with verifiable rewards: the registry, and the one call the ledger makes for a prompt.

``task_prompt("reverse_text", 17, tokenizer)`` returns the text and token ids of training
prompt 17 of that task; everything about it is a pure function of (task, seed, index).
Built-ins: ``reverse_text`` and ``arithmetic``; users add theirs with :func:`register_task`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from trainer.tasks.arithmetic import Arithmetic
from trainer.tasks.base import EVAL_STREAM_OFFSET, Example, Task
from trainer.tasks.reverse_text import ReverseText

__all__ = [
    "EVAL_STREAM_OFFSET",
    "Example",
    "Task",
    "TaskPrompt",
    "example_reward",
    "get_task",
    "register_task",
    "task_names",
    "task_prompt",
]

_REGISTRY: dict[str, Callable[[int], Task]] = {"reverse_text": ReverseText, "arithmetic": Arithmetic}


class TextEncoder(Protocol):
    """The part of an HF tokenizer that prompts need."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class TaskPrompt:
    task: str
    index: int
    text: str
    token_ids: list[int]


def register_task(name: str, factory: Callable[[int], Task]) -> None:
    """Make ``factory(seed)`` available as ``name`` (refuses to shadow an existing task)."""
    if name in _REGISTRY:
        raise ValueError(f"task {name!r} is already registered")
    _REGISTRY[name] = factory


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str, seed: int = 0) -> Task:
    """The task registered as ``name``, with its example generator seeded by ``seed``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}") from None
    return factory(seed)


def example_reward(task: str, example_index: int, completion: str, seed: int = 0) -> float:
    """The reward of ``completion`` (decoded text, without EOS) for example ``example_index`` of ``task``:
    what validators and the orchestrator compute, never taken from a worker."""
    resolved = get_task(task, seed)
    return resolved.reward(resolved.example(example_index), completion)


def task_prompt(task: str | Task, index: int, tokenizer: TextEncoder, seed: int = 0) -> TaskPrompt:
    """Text and token ids of training prompt ``index`` of ``task`` (no special tokens added)."""
    resolved = get_task(task, seed) if isinstance(task, str) else task
    text = resolved.example(index).prompt
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    return TaskPrompt(task=resolved.name, index=index, text=text, token_ids=token_ids)
