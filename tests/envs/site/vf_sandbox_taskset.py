"""A verifiers v1 taskset whose reward needs the runtime, a sandbox (importable as ``vf_sandbox_taskset``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.taskset import Taskset

from tests.envs.site.vf_echo_taskset import EchoConfig, EchoData, EchoTask


class SandboxTask(EchoTask):
    @vf.reward(weight=1.0)
    async def tests_pass(self, trace: Any, runtime: Any) -> float:
        return 1.0


class SandboxTaskset(Taskset[SandboxTask, EchoConfig]):
    def load(self) -> Iterator[SandboxTask]:
        yield SandboxTask(EchoData(prompt="reverse: abc", answer="cba"))


__all__ = ["SandboxTaskset"]
