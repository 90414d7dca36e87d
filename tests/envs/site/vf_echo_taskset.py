"""A verifiers v1 taskset written for the tests (importable as the top-level ``vf_echo_taskset``).

Task i asks to reverse a word; two pure-trace rewards, weighted 0.75 and 0.25.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.configs.taskset import TasksetConfig
from verifiers.v1.task import Task, TaskData
from verifiers.v1.taskset import Taskset

WORDS = ["abc", "dog", "cab", "bead", "faced", "gab", "hide", "deaf"]


class EchoData(TaskData):
    answer: str = ""


class EchoTask(Task[EchoData]):
    @vf.reward(weight=0.75)
    async def exact(self, task: EchoData, trace: Any) -> float:
        return 1.0 if trace.last_reply == task.answer else 0.0

    @vf.reward(weight=0.25)
    async def starts_right(self, task: EchoData, trace: Any) -> float:
        return 1.0 if trace.last_reply[:1] == task.answer[:1] else 0.0


class EchoConfig(TasksetConfig):
    count: int = 8


class EchoTaskset(Taskset[EchoTask, EchoConfig]):
    def load(self) -> Iterator[EchoTask]:
        for i in range(self.config.count):
            word = WORDS[i % len(WORDS)]
            yield EchoTask(EchoData(prompt=f"reverse: {word}", answer=word[::-1]))


__all__ = ["EchoTaskset"]
