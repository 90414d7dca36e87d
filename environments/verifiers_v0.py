"""The ``verifiers`` adapter, v0 API: ``load_environment()`` returning a ``SingleTurnEnv``, scored by its ``Rubric``.

A v0 environment (``api = "v0"``) is a module with ``load_environment(**args)`` (loaded as verifiers' own
``vf.load_environment`` does). A ``SingleTurnEnv`` without tools is served here; a ``MultiTurnEnv`` is
replayed episode by episode (:mod:`environments.verifiers_v0_episodes`). Examples are the rows of the
environment's formatted dataset (its ``prompt`` messages, which already carry the environment's system prompt
and few-shot messages, its ``answer`` and ``info``), the first ``limit`` of them read once. When the
environment has an ``eval_dataset`` it is the eval split and the whole dataset is trained on; otherwise the
last ``eval_fraction`` of the dataset is held out as in v1. Either way eval rows whose prompt a training row
asks are dropped, and a split that holds nothing out is refused.

A completion is scored as v0 scores a finished rollout: the rollout state is built from the row (as
``Environment.init_state`` builds it, without a client), the completion becomes the one assistant message of
the one trajectory step, and each reward function of the rubric (of every rubric of a ``RubricGroup``) is
called through the rubric's own ``_call_individual_reward_func``, with the keyword arguments it picks from the
function's signature (``prompt``, ``completion``, ``answer``, ``state``, ``task``, ``info``, the ``parser``,
the row's other columns...). The completion is parsed by the environment's parser where the reward asks it to
(``parser.parse_answer(completion)``), as in v0. A reward that raises scores 0, as in v0. The named rewards
are the functions' names with their rubric weights, including the metrics the environment adds itself
(``num_turns``, weight 0); the total is their weighted sum, v0's ``reward``.

Refused at start-up, naming the reward: a ``JudgeRubric`` or a reward that asks for a client (a judge model or
the network), a group reward (scored over a group of rollouts), a reward with a parameter no offline scorer
can fill, an environment that serves tools, and one that is not a ``MultiTurnEnv``
(:mod:`environments.verifiers_v0_episodes` refuses tool-calling and sandbox ones). The determinism check at
start-up (score twice, compare) catches rewards whose answers vary. Building a v0 environment leaves the
process's signal handlers alone (v0 would install its own), so it also works off the main thread.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import json
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from environments.base import ChatMessage, Environment, Example, Scores
from environments.config import VerifiersEnvConfig
from environments.verifiers_env import environment_name, held_out_split, split_train_eval
from protocol.errors import ConfigError

SCORE_PARAMETERS = frozenset({"prompt", "completion", "answer", "state", "task", "info"})
"""What the v0 rubric passes every reward function, besides its class objects and the row's columns."""
NETWORK_OBJECTS = ("judge", "client", "sandbox")
"""Class objects whose names say they reach a model, a sandbox or the network: rewards asking for them are refused."""
ROLES = frozenset({"system", "user", "assistant"})
TRAJECTORY_ID = "offline"
"""The rollout's trajectory id (v0 draws a random one; a validator's score must not depend on it)."""


def module_name(environment_id: str) -> str:
    """The module of a v0 environment id (verifiers' own ``env_module_name``)."""
    return environment_id.replace("-", "_").split("/")[-1]


@contextmanager
def _process_signals_kept() -> Iterator[None]:
    """While a v0 environment is built, its ``signal.signal`` calls change nothing.

    v0's ``Environment.__post_init__`` installs SIGINT and SIGTERM handlers of its own (to run its
    teardown), which would replace the role's own shutdown handling, and raises ``ValueError``
    outside the main thread (validators load the environment in a worker thread). Only that
    module's view of ``signal`` is swapped, and only for the duration of the load.
    """
    module: Any = importlib.import_module("verifiers.legacy.envs.environment")
    original = getattr(module, "signal", None)
    if original is not signal:
        yield
        return
    module.signal = SimpleNamespace(**{**vars(signal), "signal": lambda signum, handler: signal.getsignal(signum)})
    try:
        yield
    finally:
        module.signal = original


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None) for part in content]
        if all(isinstance(part, str) for part in parts):
            return "".join(parts)  # type: ignore[arg-type]
    raise ConfigError(f"{where} has non-text content ({type(content).__name__}): the network serves text prompts")


def _messages(row: Mapping[str, Any], where: str) -> tuple[ChatMessage, ...]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return (ChatMessage("user", prompt),)
    messages: list[ChatMessage] = []
    for message in prompt or []:
        role = message.get("role") if isinstance(message, Mapping) else getattr(message, "role", None)
        content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
        if role not in ROLES:
            raise ConfigError(f"{where} has a {role!r} message: the network serves system, user and assistant ones")
        messages.append(ChatMessage(str(role), _text(content, where)))
    if not messages:
        raise ConfigError(f"{where} has no prompt: the network needs one to hand out")
    return tuple(messages)


def _rubrics(rubric: Any) -> list[Any]:
    """The leaf rubrics of ``rubric`` (the members of a RubricGroup, recursively)."""
    members = getattr(rubric, "rubrics", None)
    if members is None:
        return [rubric]
    return [leaf for member in members for leaf in _rubrics(member)]


def _reward_name(func: Callable[..., Any]) -> str:
    return str(getattr(func, "__name__", repr(func)))


def offline_problems(env: Any, row: Mapping[str, Any]) -> list[str]:
    """Why ``env`` cannot be scored by a validator from a completion alone (empty: it can)."""
    import verifiers as vf

    kind = type(env).__name__
    if not isinstance(env, vf.MultiTurnEnv):
        return [f"environment {kind} is neither a SingleTurnEnv nor a MultiTurnEnv"]
    if env.tool_defs:
        return [f"environment {kind} serves tools"]
    problems: list[str] = []
    columns = set(row) - set(vf.State.INPUT_FIELDS)
    names: list[str] = []
    for rubric in _rubrics(env.rubric):
        judge = isinstance(rubric, vf.JudgeRubric)
        reachable = sorted(name for name in rubric.class_objects if any(word in name for word in NETWORK_OBJECTS))
        if judge and not rubric.funcs:
            problems.append(f"rubric {type(rubric).__name__} needs a judge model")
        for func in rubric.funcs:
            name = _reward_name(func)
            names.append(name)
            parameters = inspect.signature(func).parameters
            wants_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
            asked = set(parameters) if not wants_all else set(rubric.class_objects)
            if judge:
                problems.append(f"reward {name!r} needs a judge model ({type(rubric).__name__})")
            elif rubric._is_group_func(func):
                problems.append(f"reward {name!r} is a group reward (it scores a group of rollouts together)")
            elif asked & set(reachable):
                problems.append(f"reward {name!r} needs {', '.join(sorted(asked & set(reachable)))} (the network)")
            else:
                offered = SCORE_PARAMETERS | set(rubric.class_objects) | columns
                missing = sorted(
                    p.name
                    for p in parameters.values()
                    if p.name not in offered
                    and p.default is p.empty
                    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)
                )
                if missing:
                    problems.append(f"reward {name!r} needs {', '.join(missing)}, which validators cannot provide")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        problems.append(f"reward {duplicates[0]!r} is defined twice (named rewards must be unique)")
    if not names and not problems:
        problems.append(f"environment {kind} has no reward functions")
    return problems


def load_v0_environment(config: VerifiersEnvConfig) -> Any:
    """The verifiers v0 environment object ``config`` names (``load_environment(**args)``); ConfigError when not."""
    try:
        from verifiers.legacy.utils.env_utils import load_environment
    except ImportError as exc:
        raise ConfigError(
            f"verifiers v0 environment {config.taskset!r} needs verifiers' v0 API (verifiers.legacy), "
            f"which this verifiers does not have ({exc}): pip install verifiers==0.3.1"
        ) from exc
    try:
        with _process_signals_kept():
            return load_environment(config.taskset, **config.args)
    except (ImportError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"verifiers v0 environment {config.taskset!r} cannot be loaded: {exc}") from exc


def trajectory_step(prompt: list[Any], completion: str) -> Any:
    """One model turn of a rollout as v0 records it (no response object, no tokens: validators have neither)."""
    import verifiers as vf

    return vf.TrajectoryStep(
        prompt=prompt,
        completion=[vf.AssistantMessage(content=completion)],
        response=None,
        tokens=None,
        reward=None,
        advantage=None,
        is_truncated=False,
        trajectory_id=TRAJECTORY_ID,
        extras={},
    )


async def rubric_scores(rubric: Any, state: Any) -> Scores:
    """Every reward function of ``rubric`` (of each rubric of a group) on the finished rollout ``state``, called by
    the rubric itself, with its weight: one state for all of them, as in v0."""
    values: dict[str, float] = {}
    weights: dict[str, float] = {}
    for leaf in _rubrics(rubric):
        for func, weight in zip(leaf.funcs, leaf.weights, strict=True):
            values[_reward_name(func)] = float(await leaf._call_individual_reward_func(func, state))
            weights[_reward_name(func)] = float(weight)
    return Scores(values, weights)


class VerifiersV0Environment(Environment):
    default_max_tokens = 64

    def __init__(self, config: VerifiersEnvConfig, env: Any) -> None:
        self.config = config
        self.name = environment_name(config.taskset)
        self.env: Any = env
        if self.env.message_type != "chat":
            raise ConfigError(
                f"verifiers v0 environment {config.taskset!r} uses message_type {self.env.message_type!r}: "
                "only chat environments are served"
            )
        train, held_out = self._rows("dataset"), self._rows("eval_dataset")
        rows = train or held_out
        if not rows:
            raise ConfigError(f"verifiers v0 environment {config.taskset!r} has no dataset rows")
        problems = offline_problems(self.env, rows[0])
        if problems:
            raise ConfigError(
                f"verifiers v0 environment {config.taskset!r} cannot be scored offline by validators: {problems[0]}"
            )
        where = f"verifiers v0 environment {config.taskset!r}"
        if not (train and held_out):
            train, held_out = split_train_eval(rows, config.eval_fraction)
        self._train, self._eval = held_out_split(where, train, held_out, lambda row: _messages(row, where))

    def _rows(self, which: str) -> list[dict[str, Any]]:
        build = self.env.build_dataset if which == "dataset" else self.env.build_eval_dataset
        dataset = build()
        if dataset is None:
            return []
        return list(dataset.select(range(min(self.config.limit, len(dataset)))).to_list())

    def _row(self, example: Example) -> dict[str, Any]:
        split, position = example.data
        row: dict[str, Any] = (self._eval if split == "eval" else self._train)[position]
        return row

    def _example(self, index: int, split: str, rows: list[dict[str, Any]], number: int) -> Example:
        position = number % len(rows)
        row = rows[position]
        answer = row.get("answer")
        return Example(
            index=index,
            prompt=_messages(row, f"verifiers v0 environment {self.config.taskset!r} {split} row {position}"),
            answer=answer if isinstance(answer, str) and answer else None,
            data=(split, position),
        )

    def example(self, index: int) -> Example:
        return self._example(index, "train", self._train, index)

    def eval_example(self, number: int) -> Example:
        return self._example(-1 - number, "eval", self._eval, number)

    def _state(self, row: dict[str, Any], completion: str | None) -> Any:
        """The state of a finished single-turn rollout of ``row``, as v0's ``init_state`` and rollout leave it;
        ``completion`` None: the state before any turn."""
        import verifiers as vf
        from verifiers.types import flatten_task_input
        from verifiers.utils.message_utils import normalize_messages

        state_input = copy.deepcopy(row)
        if isinstance(state_input.get("info"), str):
            state_input["info"] = json.loads(state_input["info"])
        task = flatten_task_input(state_input)
        state = vf.State(input=task)
        state["task"] = task
        prompt = normalize_messages(task["prompt"], field_name="input.prompt")
        replies = [] if completion is None else [vf.AssistantMessage(content=completion)]
        state.update(
            prompt=prompt,
            completion=replies,
            tool_defs=[],
            trajectory=[trajectory_step(prompt, completion)] if completion is not None else [],
            trajectory_id=TRAJECTORY_ID,
            is_completed=completion is not None,
            is_truncated=False,
            stop_condition=None,
            reward=None,
            metrics=None,
            error=None,
            final_env_response=None,
        )
        return state

    def score(self, example: Example, completion: str) -> Scores:
        return asyncio.run(rubric_scores(self.env.rubric, self._state(self._row(example), completion)))
