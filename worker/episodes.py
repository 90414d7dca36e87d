"""A worker's multi-turn tasks: every sample played as an episode with the run's environment
(:func:`engines.episodes.play_episodes`), and the submission of the played turns.

Nothing here is trusted by anyone else: validators rebuild every prompt and reply from the policy's sampled
tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engines.episodes import EpisodeRequest, Generate, PlayedEpisode, play_episodes
from environments.episode import EpisodeError, EpisodeRun, MultiTurnEnvironment
from protocol.schemas import SubmitRequest, Task
from worker.submission import build_turns_submission


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
