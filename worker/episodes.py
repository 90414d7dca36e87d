"""Multi-turn episodes on a worker: each policy turn drawn by the verifiable sampler, each reply the environment's.

A group's episodes advance together, one policy turn at a time: every episode still going gets its next
prompt (its transcript so far through the chat template, :class:`environments.episode.EpisodeRun`), the
engine generates all of them in one batch, and each completion goes back to its episode, which asks the
environment for its reply or ends. Turn ``t`` of sample ``(p, s)`` is drawn on noise stream
:func:`toploc.sampling.turn_stream` ``(p, s, t)`` with the task's seed, so a validator replays each draw as it
replays a single-turn sample. Nothing here is trusted by anyone else: validators rebuild every prompt and
reply from the policy's sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.base import GenerationRequest, GenerationResult
from environments.base import Example
from environments.episode import Episode, EpisodeError, EpisodeRun, MultiTurnEnvironment, policy_turn
from protocol.schemas import SubmitRequest, Task
from toploc.sampling import turn_stream
from worker.submission import build_turns_submission

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


@dataclass(frozen=True)
class EpisodePlayer:
    """What a worker of a multi-turn run plays its tasks with: the run's environment and the policy's tokenizer."""

    environment: MultiTurnEnvironment
    tokenizer: Any

    def play(self, generate: Generate, task: Task, eos_token_ids: tuple[int, ...]) -> list[PlayedEpisode]:
        """Every sample of ``task`` played as an episode. EpisodeError when a prompt of the task is not its
        example's first prompt here (this node's environment differs from the run's)."""
        requests = []
        for prompt in task.prompts:
            if prompt.example_index is None:
                raise EpisodeError(f"prompt {prompt.prompt_index} of task {task.task_id} names no example")
            example = self.environment.example(prompt.example_index)
            if EpisodeRun(self.environment, example).prompt_ids(self.tokenizer) != list(prompt.token_ids):
                raise EpisodeError(
                    f"prompt {prompt.prompt_index} of task {task.task_id} is not example {prompt.example_index}'s "
                    "first prompt in this node's environment"
                )
            requests += [
                EpisodeRequest(f"{task.task_id}/{prompt.prompt_index}/{s}", example, prompt.prompt_index, s)
                for s in range(task.group_size)
            ]
        return play_episodes(
            generate,
            self.environment,
            requests,
            self.tokenizer,
            seed=task.sampling_seed,
            max_tokens=task.sampling.max_tokens,
            temperature=task.sampling.temperature,
            eos_token_ids=eos_token_ids,
        )


def build_episode_submission(task: Task, engine_name: str, played: Sequence[PlayedEpisode]) -> SubmitRequest:
    """The submission of a task's played episodes (:func:`worker.submission.build_turns_submission`)."""
    return build_turns_submission(task, engine_name, [(episode.uid, episode.turns) for episode in played])
