"""Multi-turn episodes played with an engine: each policy turn drawn by the verifiable sampler, each reply the
environment's.

A group's episodes advance together, one policy turn at a time: every episode still going gets its next
prompt (its transcript so far through the chat template, :class:`environments.episode.EpisodeRun`), the
engine generates all of them in one batch, and each completion goes back to its episode, which asks the
environment for its reply or ends. Turn ``t`` of sample ``(p, s)`` is drawn on noise stream
:func:`toploc.sampling.turn_stream` ``(p, s, t)`` with the task's seed, so a validator replays each draw as it
replays a single-turn sample. Workers play their tasks this way (:mod:`worker.episodes`) and evals play the
held-out examples; nothing here is trusted by anyone else: validators rebuild every prompt and reply from the
policy's sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.base import GenerationRequest, GenerationResult
from environments.base import Example
from environments.episode import Episode, EpisodeRun, MultiTurnEnvironment, policy_turn
from toploc.sampling import turn_stream

Generate = Callable[[list[GenerationRequest]], list[GenerationResult]]
"""An engine's batched generation (``Engine.generate``)."""


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to play: sample ``sample_index`` of prompt ``prompt_index`` of a task."""

    uid: str
    example: Example
    prompt_index: int
    sample_index: int


@dataclass
class PlayedEpisode:
    """An episode as played: the engine's result for each policy turn, and the transcript."""

    uid: str
    prompt_ids: list[list[int]] = field(default_factory=list)
    """Each policy turn's prompt, as the engine was given it."""
    turns: list[GenerationResult] = field(default_factory=list)
    episode: Episode | None = None


def play_episodes(
    generate: Generate,
    environment: MultiTurnEnvironment,
    requests: Sequence[EpisodeRequest],
    tokenizer: Any,
    *,
    seed: int,
    max_tokens: int,
    temperature: float,
    eos_token_ids: tuple[int, ...],
) -> list[PlayedEpisode]:
    """Play ``requests`` to their ends (within ``environment.limits``), one batched generation per policy turn;
    results in request order."""
    runs = {r.uid: EpisodeRun(environment, r.example) for r in requests}
    played = {r.uid: PlayedEpisode(r.uid) for r in requests}
    going = list(requests)
    turn = 0
    while going:
        batch = []
        for request in going:
            prompt = runs[request.uid].prompt_ids(tokenizer)
            played[request.uid].prompt_ids.append(prompt)
            batch.append(
                GenerationRequest(
                    uid=request.uid,
                    prompt_ids=prompt,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    seed=seed,
                    stream=turn_stream(request.prompt_index, request.sample_index, turn),
                    eos_token_ids=eos_token_ids,
                )
            )
        for result in generate(batch):
            played[result.uid].turns.append(result)
            runs[result.uid].add_turn(policy_turn(tokenizer, result.completion_ids, eos_token_ids))
        going = [r for r in going if runs[r.uid].ended_by is None]
        turn += 1
    for uid, run in runs.items():
        played[uid].episode = run.episode()
    return [played[r.uid] for r in requests]
