"""verifiers v0 environments validators cannot score offline (importable as ``vf0_refused_env``).

``load_environment(kind=...)``: ``judge`` (a JudgeRubric), ``group`` (a group reward),
``missing`` (a reward asking for a parameter nobody provides), ``tools`` (a ToolEnv), ``flaky`` (a reward that
draws a random number: loads, then fails the determinism check) and ``clocked`` (a MultiTurnEnv whose reply
reads the clock: loads, then fails the replay check).
"""

from __future__ import annotations

import random
import time
from typing import Any

import verifiers as vf
from openai import AsyncOpenAI

from tests.envs.site.vf0_echo_env import exact, rows


def judged(judge: Any, prompt: Any, completion: Any, answer: str) -> float:
    return 1.0


def relative(completions: list[Any], answers: list[str]) -> list[float]:
    return [1.0 for _ in completions]


def runs_tests(completion: Any, test_cases: list[str]) -> float:
    return 1.0


def luck(completion: Any) -> float:
    return random.random()


def lookup(word: str) -> str:
    """Look a word up."""
    return word


class Clocked(vf.MultiTurnEnv):
    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        return [vf.UserMessage(content=f"it is {time.monotonic_ns()}")]


def load_environment(kind: str) -> Any:
    dataset = rows(["abc", "dog", "cab"])
    if kind == "clocked":
        return Clocked(dataset=dataset, rubric=vf.Rubric(funcs=[exact]), max_turns=3)
    if kind == "tools":
        return vf.ToolEnv(dataset=dataset, tools=[lookup], rubric=vf.Rubric(funcs=[exact]))
    if kind == "judge":
        client = AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9")
        rubric: Any = vf.JudgeRubric(judge_client=client)
        rubric.add_reward_func(judged)
    else:
        funcs = {"group": [exact, relative], "missing": [exact, runs_tests], "flaky": [exact, luck]}[kind]
        rubric = vf.Rubric(funcs=funcs)
    return vf.SingleTurnEnv(dataset=dataset, rubric=rubric)
