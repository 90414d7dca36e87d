"""Multi-turn episodes that anyone can replay: the environment's turns are a pure function of the transcript.

A :class:`MultiTurnEnvironment` answers the policy: after each policy turn, :meth:`~MultiTurnEnvironment.reply`
returns the environment's next messages (a tool's output, a game's move, a simulated user's answer), or None
when the episode is over. A reply is a pure function of (environment config, example, transcript so far): no
clock, network, randomness of its own or state kept between calls. That is what makes an episode from an
untrusted worker checkable: the trusted side takes only the policy's sampled turns from the worker and
replays every environment turn itself (:func:`replay`), so a tampered tool output, a turn the environment
would not have allowed or an episode stopped early is found by comparison, not by trust.

Tokens are the trusted side's too. The prompt of policy turn k is the chat template applied to every message
before it (:func:`turn_prompt_ids`); the tokens the policy sampled are exactly the completions. When each
turn's prompt extends the previous prompt plus its completion token for token, the turns merge into one
training sample whose loss mask covers only the sampled tokens; where a re-rendered transcript does not
extend (a template that rewrites earlier turns, a completion that re-tokenizes differently), a new sample
starts (:func:`episode_samples`). Nothing a worker declares about spans or masks enters either.

Limits per episode (:class:`~environments.config.EpisodeLimits`: policy turns, reply length, reply time) bound
what a worker can make a validator compute. An environment that fails its own limits (or raises) is an
:class:`EnvironmentReplyError`, the run's matter; a transcript the environment would not have produced is an
:class:`EpisodeError`, the worker's.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from environments.base import ChatMessage, Environment, Example, Scores, failure_summary, finite_scores
from environments.config import EpisodeLimits
from environments.render import chat_messages, prompt_ids, render_messages
from environments.truncation import is_truncated, no_credit

ENV_ROLES = frozenset({"tool", "user"})
"""Roles an environment reply may speak in: the policy alone is ``assistant``; ``system`` is the prompt's."""


class EpisodeError(ValueError):
    """An episode that cannot be what it claims: the reason is one line for the worker's rejection."""


class EnvironmentReplyError(Exception):
    """The environment failed to reply within its limits (it raised, was too slow or too long, or replied with
    something other than messages): the run's fault, never the worker's; the reason is one line."""


@dataclass(frozen=True)
class PolicyTurn:
    """What the policy wrote in one turn, as the trusted side reads it from the sampled tokens."""

    text: str
    """The completion decoded, end token dropped."""
    truncated: bool
    """Cut at the token budget without an end token: the episode ends with it."""


class MultiTurnEnvironment(Environment):
    """An environment that answers the policy's turns. :meth:`score` scores the final answer; override
    :meth:`score_episode` to score the whole transcript."""

    limits: EpisodeLimits = EpisodeLimits()
    """The run's bounds on an episode; the loader sets the section's ``episode``."""

    @abstractmethod
    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        """The environment's messages after the policy's last turn (``transcript[-1]``, role ``assistant``),
        or None when the episode is over. A pure function of (config, example, transcript)."""

    def reference_turns(self, example: Example) -> Sequence[str] | None:
        """The policy turns of a model episode of ``example`` (what SFT trains on), or None when there is none."""
        return None

    def probe_turns(self, example: Example) -> Sequence[str]:
        """Policy turns that reach this environment's replies (a tool call, a move), for the start-up check that
        plays episodes twice (:func:`environments.loader.check_replayable`); each is repeated until the episode
        ends. The check also plays a few generic ones (the answer, an empty turn)."""
        return ()

    def score_episode(self, example: Example, transcript: tuple[ChatMessage, ...]) -> Scores:
        """The named rewards of the episode; by default :meth:`score` of the policy's last turn."""
        last = next(m.content for m in reversed(transcript) if m.role == "assistant")
        return self.score(example, last)


def episode_turns(environment: Environment) -> int:
    """The most policy turns an episode of ``environment`` may have: 1 unless it answers the policy."""
    return environment.limits.max_turns if isinstance(environment, MultiTurnEnvironment) else 1


@dataclass(frozen=True)
class Episode:
    """A replayed episode: the prompt's messages, then the policy's turns and the environment's replies."""

    example: Example
    messages: tuple[ChatMessage, ...]
    """The whole transcript, the prompt's messages first."""
    turn_starts: tuple[int, ...]
    """Index in :attr:`messages` of each policy turn."""
    ended_by: str
    """``environment`` (it replied None), ``turn_limit`` or ``truncated`` (the last turn was cut)."""


def _checked_reply(
    environment: MultiTurnEnvironment, example: Example, transcript: tuple[ChatMessage, ...]
) -> tuple[ChatMessage, ...] | None:
    limits = environment.limits
    started = time.perf_counter()
    try:
        reply = environment.reply(example, transcript)
    except Exception as exc:  # the environment's own code: whatever it raises is its failure, not the worker's
        raise EnvironmentReplyError(f"the environment's reply failed: {failure_summary(exc)}") from exc
    took = time.perf_counter() - started
    if took > limits.reply_time_s:
        raise EnvironmentReplyError(
            f"the environment took {took:.2f} s to reply, over the {limits.reply_time_s} s limit"
        )
    if reply is None:
        return None
    messages = isinstance(reply, tuple | list) and bool(reply)
    if not messages or not all(
        isinstance(m, ChatMessage) and m.role in ENV_ROLES and isinstance(m.content, str) for m in reply
    ):
        raise EnvironmentReplyError(f"the environment's reply must be one or more {sorted(ENV_ROLES)} messages")
    size = sum(len(m.content) for m in reply)
    if size > limits.max_reply_chars:
        raise EnvironmentReplyError(
            f"the environment's reply has {size} characters, over the {limits.max_reply_chars} limit"
        )
    return tuple(reply)


class EpisodeRun:
    """An episode as it is played: the transcript so far, and whether the policy has another turn.

    The worker plays one with its engine; :func:`replay` plays one from a submission's turns. Both go through
    :meth:`add_turn`, so both build the same transcript from the same turns."""

    def __init__(self, environment: MultiTurnEnvironment, example: Example) -> None:
        self.environment, self.example, self.limits = environment, example, environment.limits
        prompt = chat_messages(example, environment.system_prompt)
        self.messages: tuple[ChatMessage, ...] = tuple(ChatMessage(m["role"], m["content"]) for m in prompt)
        self.turn_starts: list[int] = []
        self.ended_by: str | None = None
        """None while the policy has another turn; then as :attr:`Episode.ended_by`."""

    def prompt_ids(self, tokenizer: Any) -> list[int]:
        """The next policy turn's prompt: the transcript so far, rendered and encoded."""
        return _turn_prompt(self.environment, self.example, self.messages, not self.turn_starts, tokenizer)

    def add_turn(self, turn: PolicyTurn) -> None:
        """The policy's next turn, and the environment's reply to it (or the episode's end)."""
        if self.ended_by is not None:
            raise EpisodeError(f"the episode ended ({self.ended_by}) after policy turn {len(self.turn_starts)}")
        self.turn_starts.append(len(self.messages))
        self.messages = (*self.messages, ChatMessage("assistant", turn.text))
        if turn.truncated:
            self.ended_by = "truncated"
        elif len(self.turn_starts) >= self.limits.max_turns:
            self.ended_by = "turn_limit"
        else:
            reply = _checked_reply(self.environment, self.example, self.messages)
            if reply is None:
                self.ended_by = "environment"
            else:
                self.messages = (*self.messages, *reply)

    def episode(self) -> Episode:
        if self.ended_by is None:
            raise EpisodeError(
                f"the episode stops after policy turn {len(self.turn_starts)}, but the environment replied and "
                f"the {self.limits.max_turns}-turn limit was not reached"
            )
        return Episode(self.example, self.messages, tuple(self.turn_starts), self.ended_by)


_ENDED_EARLY = {
    "truncated": "policy turn {n} was cut at the token budget, which ends the episode",
    "environment": "the environment ended the episode after policy turn {n} of {total}",
    "turn_limit": "{total} policy turns, over the episode limit of {n}",
}


def replay(
    environment: MultiTurnEnvironment,
    example: Example,
    turns: Sequence[PolicyTurn],
) -> Episode:
    """The episode whose policy turns were ``turns``, every environment reply recomputed here within
    ``environment.limits``.

    EpisodeError when ``turns`` cannot be that episode: no turn, more turns than the episode allows (the
    environment ended it, a turn was cut, or the turn limit was reached before them) or fewer (the environment
    still expected an answer and the limit was not reached: an episode stopped early by its worker)."""
    if not turns:
        raise EpisodeError("an episode has at least one policy turn")
    limits = environment.limits
    if len(turns) > limits.max_turns:
        raise EpisodeError(f"{len(turns)} policy turns, over the episode limit of {limits.max_turns}")
    run = EpisodeRun(environment, example)
    for number, turn in enumerate(turns, start=1):
        run.add_turn(turn)
        if run.ended_by is not None and number < len(turns):
            raise EpisodeError(_ENDED_EARLY[run.ended_by].format(n=number, total=len(turns)))
    return run.episode()


def policy_turn(tokenizer: Any, completion_ids: Sequence[int], eos_token_ids: Sequence[int]) -> PolicyTurn:
    """A turn as the trusted side reads its sampled tokens: cut when the last is not an end token, else decoded
    without it (special tokens skipped, as single-turn completions are scored)."""
    ids = list(completion_ids)
    truncated = is_truncated(ids, eos_token_ids)
    text = tokenizer.decode(ids if truncated else ids[:-1], skip_special_tokens=True)
    return PolicyTurn(str(text), truncated)


def _turn_prompt(
    environment: MultiTurnEnvironment, example: Example, before: Sequence[ChatMessage], first: bool, tokenizer: Any
) -> list[int]:
    """A policy turn's prompt ids from the messages ``before`` it. The first turn's is the example's prompt exactly
    as a single-turn task's (:func:`environments.render.prompt_ids`), which the ledger issues."""
    if first:
        return prompt_ids(environment, example, tokenizer)
    return list(tokenizer.encode(render_messages(before, tokenizer), add_special_tokens=False))


def turn_prompt_ids(environment: MultiTurnEnvironment, episode: Episode, tokenizer: Any) -> list[list[int]]:
    """The prompt token ids of each policy turn, as :meth:`EpisodeRun.prompt_ids` gave them while it was played."""
    return [
        _turn_prompt(environment, episode.example, episode.messages[:start], number == 0, tokenizer)
        for number, start in enumerate(episode.turn_starts)
    ]


@dataclass(frozen=True)
class EpisodeSample:
    """One training sample of an episode: its tokens, and which of them the policy sampled."""

    token_ids: tuple[int, ...]
    sampled: tuple[bool, ...]
    """True where the policy sampled the token (the loss covers those); False for prompt and environment tokens."""
    turns: tuple[int, ...]
    """The policy turns (0-based) the sample holds."""

    @property
    def prompt_len(self) -> int:
        """Tokens before the first sampled one."""
        return self.sampled.index(True) if True in self.sampled else len(self.sampled)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.token_ids[: self.prompt_len])

    @property
    def completion_ids(self) -> list[int]:
        """From the first sampled token on (environment tokens between turns included)."""
        return list(self.token_ids[self.prompt_len :])

    @property
    def completion_sampled(self) -> list[bool] | None:
        """Which of :attr:`completion_ids` the policy sampled; None when all of them (a single turn)."""
        flags = list(self.sampled[self.prompt_len :])
        return None if all(flags) else flags


def episode_samples(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[EpisodeSample]:
    """Training samples of an episode from each policy turn's prompt and sampled completion token ids.

    Turn k joins the sample of turn k - 1 when its prompt starts with that sample's tokens; the tokens in
    between (the environment's reply, the template's markers) are not sampled. Otherwise turn k starts a
    sample of its own."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("an episode has one prompt per policy turn and at least one turn")
    samples: list[EpisodeSample] = []
    tokens: list[int] = []
    sampled: list[bool] = []
    turns: list[int] = []
    for number, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        if turns and list(prompt[: len(tokens)]) == tokens:
            added = list(prompt[len(tokens) :])
        else:
            if turns:
                samples.append(EpisodeSample(tuple(tokens), tuple(sampled), tuple(turns)))
            tokens, sampled, turns, added = [], [], [], list(prompt)
        tokens += added + list(completion)
        sampled += [False] * len(added) + [True] * len(completion)
        turns.append(number)
    samples.append(EpisodeSample(tuple(tokens), tuple(sampled), tuple(turns)))
    return samples


def rebuild_episode(
    environment: MultiTurnEnvironment,
    example: Example,
    turn_ids: Sequence[Sequence[int]],
    tokenizer: Any,
    eos_token_ids: Sequence[int],
) -> tuple[Episode, list[list[int]]]:
    """The episode whose policy turns sampled ``turn_ids``, and each turn's prompt ids: all the trusted side
    needs, from the sampled tokens alone. EpisodeError when the turns cannot be that episode."""
    episode = replay(environment, example, [policy_turn(tokenizer, ids, eos_token_ids) for ids in turn_ids])
    return episode, turn_prompt_ids(environment, episode, tokenizer)


def issued_turn_prompts(
    environment: MultiTurnEnvironment,
    example_index: int | None,
    issued: Sequence[int],
    turn_ids: Sequence[Sequence[int]],
    tokenizer: Any,
    eos_token_ids: Sequence[int],
) -> list[list[int]]:
    """Each policy turn's prompt ids of the episode of example ``example_index`` whose turns sampled ``turn_ids``
    (:func:`rebuild_episode`), the first checked against ``issued``, the prompt the ledger issued. EpisodeError
    when the prompt names no example, the first prompt is not the issued one, or the turns cannot be the
    episode."""
    if example_index is None:
        raise EpisodeError("the prompt carries no example index, so its episode cannot be replayed")
    example = environment.example(example_index)
    _episode, prompts = rebuild_episode(environment, example, turn_ids, tokenizer, eos_token_ids)
    if prompts[0] != list(issued):
        raise EpisodeError(f"the environment's first prompt is not the task's (example {example_index})")
    return prompts


def episode_scores(environment: MultiTurnEnvironment, episode: Episode) -> Scores:
    """The episode's rewards under the run's truncation rule: an episode whose last turn was cut at the token
    budget earns what a cut single-turn completion does (:mod:`environments.truncation`)."""
    scores = finite_scores(environment.score_episode(episode.example, episode.messages))
    if episode.ended_by == "truncated" and environment.truncated == "minimum":
        return no_credit(scores)
    return scores
