"""The ``verifiers`` adapter, v1 API: an installed ``Taskset``, scored offline with its own reward code.

verifiers has two APIs: v1 (``verifiers.v1``: a ``Taskset`` yielding ``Task`` s whose
``@vf.reward`` methods score a ``Trace``), served here, and v0 (``load_environment()`` returning a
``SingleTurnEnv`` with a ``Rubric``), served by :mod:`environments.verifiers_v0`; the section's
``api`` picks one. The network is single-turn: a worker answers the task's prompt once, and the
validator scores the completion by building the trace the harness would have recorded (the
prompt, then the completion as the sampled assistant message) and calling ``Task.score`` on it
with no runtime. The eval split is the last ``eval_fraction`` of the tasks read, less any whose
prompt a training task asks (:func:`held_out_split`); one that holds nothing out is refused.

Only rewards that read the trace (and the task's data) can be scored that way, so a taskset is
refused at start-up, naming the culprit, when a task needs a container, serves tools, plugs a
judge model, or has a reward or metric that asks for the ``runtime`` (a sandbox). Whether a
pure-trace reward calls the network cannot be seen from its signature; the determinism check at
start-up (score twice, compare) catches the ones whose answers vary.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Callable
from typing import Any

from environments.base import ChatMessage, Environment, Example, Scores
from environments.config import VerifiersEnvConfig
from environments.held_out import held_out_items, prompt_key
from protocol.errors import ConfigError

OFFLINE_PARAMETERS = frozenset({"self", "task", "trace"})
"""What a reward may ask for to be scored by a validator: the task's data and the trace."""


def environment_name(identifier: str) -> str:
    """The short name of a taskset or environment id (``owner/name@version`` -> ``name``)."""
    return identifier.rsplit("/", 1)[-1].split("@", 1)[0][:64]


def split_train_eval(items: list[Any], eval_fraction: float) -> tuple[list[Any], list[Any]]:
    """(train, eval): the last ``eval_fraction`` of ``items`` is held out (empty when that is no item)."""
    num_eval = int(len(items) * eval_fraction)
    return items[: len(items) - num_eval], items[len(items) - num_eval :]


def held_out_split(
    name: str, train: list[Any], held_out: list[Any], prompt: Callable[[Any], tuple[ChatMessage, ...]]
) -> tuple[list[Any], list[Any]]:
    """(train, eval) with every eval item whose prompt is a training prompt dropped; ConfigError when either is
    left empty (nothing to train on, or nothing held out)."""
    train, held_out = held_out_items(train, held_out, lambda item: prompt_key(prompt(item)))
    if not train:
        raise ConfigError(f"{name} has no training tasks left: raise limit or lower eval_fraction")
    if not held_out:
        raise ConfigError(f"{name} holds out no task whose prompt training never asks: raise eval_fraction or limit")
    return train, held_out


def _messages(data: Any) -> tuple[ChatMessage, ...]:
    from verifiers.v1.types import content_text

    messages: list[ChatMessage] = []
    if data.system_prompt:
        messages.append(ChatMessage("system", data.system_prompt))
    if isinstance(data.prompt, str):
        messages.append(ChatMessage("user", data.prompt))
    else:
        messages += [ChatMessage(str(m.role), content_text(m.content)) for m in data.prompt or []]
    if not messages:
        raise ConfigError(f"verifiers task {data.idx} has no prompt: the network needs one to hand out")
    return tuple(messages)


def offline_problems(task: Any) -> list[str]:
    """Why ``task`` cannot be scored by a validator from the trace alone (empty: it can)."""
    problems: list[str] = []
    kind = type(task).__name__
    if task.NEEDS_CONTAINER:
        problems.append(f"task {kind} needs a container")
    if type(task).toolsets(task.config):
        problems.append(f"task {kind} serves tools")
    for judge in task.config.judges:
        problems.append(f"reward {getattr(judge, 'reward_name', None) or type(judge).__name__!r} needs a judge model")
    for hook in ("reward", "metric"):
        for fn in task.hooks(hook):
            extra = set(inspect.signature(fn).parameters) - OFFLINE_PARAMETERS
            if extra:
                needs = "a sandbox" if "runtime" in extra else f"{', '.join(sorted(extra))}"
                problems.append(f"{hook} {fn.__name__!r} needs {needs}")
            elif not inspect.iscoroutinefunction(fn):
                problems.append(f"{hook} {fn.__name__!r} is not async (verifiers awaits every reward)")
    return problems


class VerifiersEnvironment(Environment):
    default_max_tokens = 64

    def __init__(self, config: VerifiersEnvConfig) -> None:
        from verifiers.v1.utils.loaders import taskset_class, taskset_config_type

        self.config = config
        self.name = environment_name(config.taskset)
        try:
            taskset_type = taskset_class(config.taskset)
            taskset_config = taskset_config_type(config.taskset).model_validate({**config.args, "id": config.taskset})
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise ConfigError(f"verifiers taskset {config.taskset!r} cannot be loaded: {exc}") from exc
        tasks = list(itertools.islice(iter(taskset_type(taskset_config)), config.limit))
        if not tasks:
            raise ConfigError(f"verifiers taskset {config.taskset!r} yields no tasks")
        problems = offline_problems(tasks[0])
        if problems:
            raise ConfigError(
                f"verifiers taskset {config.taskset!r} cannot be scored offline by validators: {problems[0]}"
            )
        self._train, self._eval = held_out_split(
            f"verifiers taskset {config.taskset!r}",
            *split_train_eval(tasks, config.eval_fraction),
            lambda task: _messages(task.data),
        )

    def _task(self, example: Example) -> Any:
        split, position = example.data
        return (self._eval if split == "eval" else self._train)[position]

    def _example(self, index: int, split: str, tasks: list[Any], number: int) -> Example:
        position = number % len(tasks)
        task = tasks[position]
        answer = getattr(task.data, "answer", None)
        return Example(
            index=index,
            prompt=_messages(task.data),
            answer=answer if isinstance(answer, str) else None,
            data=(split, position),
        )

    def example(self, index: int) -> Example:
        return self._example(index, "train", self._train, index)

    def eval_example(self, number: int) -> Example:
        return self._example(-1 - number, "eval", self._eval, number)

    def score(self, example: Example, completion: str) -> Scores:
        from verifiers.v1.configs.agent import AgentConfig
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage

        task = self._task(example)
        assert not isinstance(example.prompt, str)
        nodes: list[Any] = []
        for message in example.prompt:
            kind = SystemMessage if message.role == "system" else UserMessage
            nodes.append(MessageNode(parent=len(nodes) - 1 if nodes else None, message=kind(content=message.content)))
        nodes.append(MessageNode(parent=len(nodes) - 1, message=AssistantMessage(content=completion), sampled=True))
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=AgentConfig()),
            nodes=nodes,
            is_completed=True,
            ok=True,
        )
        asyncio.run(task.score(trace))
        unscored = [name for name, reward in trace.rewards.items() if reward is None]
        if unscored or not trace.rewards:
            raise ValueError(f"verifiers task {type(task).__name__}: reward {unscored or 'none'} was not scored")
        return Scores(
            {name: float(r.score) for name, r in trace.rewards.items() if r is not None},
            {name: float(r.weight) for name, r in trace.rewards.items() if r is not None},
        )
