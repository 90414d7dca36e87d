"""verifiers v0 multi-turn environments (``MultiTurnEnv``), replayed from the transcript by every role.

A v0 ``MultiTurnEnv`` answers each model turn with ``env_response(messages, state)`` and keeps what it learns
in the rollout ``state`` (a game's board, a count of guesses). The network needs a reply that is a function of
the transcript alone, so :class:`VerifiersV0EpisodeEnvironment` never keeps a state between calls: for every
reply it rebuilds the rollout state from the dataset row (as ``init_state`` and ``setup_state`` build it, with
no client), then replays the transcript's policy turns in order, appending each as a trajectory step and
calling ``env_response`` after it, exactly as v0's rollout loop does. After the last turn it asks the
environment's stop conditions (``is_completed``: ``max_turns``, the environment's own ``@vf.stop`` methods) and
either ends the episode or returns what ``env_response`` said. A ``final_env_response`` (a reply that ends
the episode) ends it too; the rubric then sees it at the end of the completion, as v0 renders it. Scores are
the rubric's, over the whole completion (every turn and reply) and that replayed state.

Served: ``MultiTurnEnv`` subclasses whose replies are text from ``env_response``. Refused at start-up, naming
the class: ``ToolEnv`` and ``StatefulToolEnv`` (their tools are called through the chat API's structured
``tool_calls``, which a policy sampled as text does not produce, and a stateful tool's arguments are injected
from hidden state), ``SandboxEnv`` and ``PythonEnv`` (a sandbox), ``EnvGroup``. Whether a reply reads the clock
or the network cannot be seen from the code: the replay check at start-up
(:func:`environments.loader.check_replayable`) plays probe episodes twice and refuses one that differs.
Tested with verifiers 0.3.1 (its ``verifiers.legacy`` v0 API).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from environments.base import ChatMessage, Example, Scores
from environments.config import VerifiersEnvConfig
from environments.episode import MultiTurnEnvironment
from environments.render import chat_messages
from environments.verifiers_v0 import VerifiersV0Environment, load_v0_environment, rubric_scores, trajectory_step
from protocol.errors import ConfigError

REFUSED_CLASSES = {
    "ToolEnv": "its tools are called through the chat API's structured tool_calls, which a text policy does not "
    "produce; write the tool as a MultiTurnEnv whose env_response reads the turn's text",
    "SandboxEnv": "it runs a sandbox, which a validator cannot replay",
    "PythonEnv": "it runs a sandbox, which a validator cannot replay",
    "EnvGroup": "a group of environments is not one environment; serve one of them",
}
"""verifiers v0 multi-turn classes that are refused, and why (subclasses included; StatefulToolEnv is a ToolEnv)."""


def refused_multi_turn(env: Any) -> str | None:
    """Why the v0 multi-turn environment ``env`` cannot be replayed by validators (None: it can)."""
    import verifiers as vf

    for name, why in REFUSED_CLASSES.items():
        cls = getattr(vf, name, None)
        if cls is not None and isinstance(env, cls):
            return f"environment {type(env).__name__} is a {name}: {why}"
    return None


def verifiers_v0_environment(config: VerifiersEnvConfig) -> VerifiersV0Environment:
    """The v0 environment ``config`` names: single-turn, or (a ``MultiTurnEnv``) replayed episode by episode."""
    import verifiers as vf

    env = load_v0_environment(config)
    if isinstance(env, vf.MultiTurnEnv) and not isinstance(env, vf.SingleTurnEnv):
        refused = refused_multi_turn(env)
        if refused is not None:
            raise ConfigError(
                f"verifiers v0 environment {config.taskset!r} cannot be replayed by validators: {refused}"
            )
        return VerifiersV0EpisodeEnvironment(config, env)
    return VerifiersV0Environment(config, env)


def _vf_messages(messages: Sequence[ChatMessage]) -> list[Any]:
    from verifiers.utils.message_utils import normalize_messages

    return list(normalize_messages([{"role": m.role, "content": m.content} for m in messages], field_name="turn"))


def _chat_messages(messages: Any) -> tuple[ChatMessage, ...]:
    """An ``env_response``'s messages as chat messages (its roles checked by the episode layer)."""
    from verifiers.utils.message_utils import maybe_normalize_messages

    found = []
    for message in maybe_normalize_messages(messages, field_name="env_response") or []:
        content = message.content if isinstance(message.content, str) else str(message.content or "")
        found.append(ChatMessage(str(message.role), content))
    return tuple(found)


class VerifiersV0EpisodeEnvironment(VerifiersV0Environment, MultiTurnEnvironment):
    """A v0 ``MultiTurnEnv``, replayed from each transcript (see the module)."""

    def _prompt_len(self, example: Example) -> int:
        return len(chat_messages(example, self.system_prompt))

    async def _replay(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[Any, Any]:
        """The rollout state after the transcript's policy turns, and the environment's reply to the last one
        (None when its stop conditions or a final response end the episode there)."""
        state = self._state(self._row(example), None)
        state = await self.env.setup_state(state) or state
        start = self._prompt_len(example)
        turns = [i for i in range(start, len(transcript)) if transcript[i].role == "assistant"]
        reply: Any = None
        for i in turns:
            step = trajectory_step(_vf_messages(transcript[:i]), transcript[i].content)
            await self.env.add_trajectory_step(state, step)
            if await self.env.is_completed(state):
                return state, None
            reply = await self.env.env_response(_vf_messages(transcript[: i + 1]), state)
            if state.get("final_env_response") is not None:
                return state, None
        return state, reply

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        _state, reply = asyncio.run(self._replay(example, transcript))
        return None if reply is None else _chat_messages(reply)

    def score_episode(self, example: Example, transcript: tuple[ChatMessage, ...]) -> Scores:
        async def scored() -> Scores:
            state, _reply = await self._replay(example, transcript)
            completion = _vf_messages(transcript[self._prompt_len(example) :])
            final = state.get("final_env_response")
            state["completion"] = completion + (_vf_messages(_chat_messages(final)) if final else [])
            return await rubric_scores(self.env.rubric, state)

        return asyncio.run(scored())

    def score(self, example: Example, completion: str) -> Scores:
        """A one-turn episode of ``completion`` (what SFT evals and the determinism probe ask)."""
        prompt = chat_messages(example, self.system_prompt)
        messages = tuple(ChatMessage(m["role"], m["content"]) for m in prompt)
        return self.score_episode(example, (*messages, ChatMessage("assistant", completion)))
