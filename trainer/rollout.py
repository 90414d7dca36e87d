"""Rollouts and evaluation through an injected engine (engines: the Engine interface).

The trainer package never imports worker/: callers pass the engine and the engine
interface's request type (``engines.base.GenerationRequest``), so :mod:`trainer.local` and the
bench programs wire a concrete engine in, and worker code may import trainer without a cycle.

Prompt ``i`` of a step is task example ``step * prompts_per_step + i``; its sample ``j`` is
drawn on noise stream ``sample_stream(i, j)`` with the step's sampling seed, so a rollout is
reproducible from (seed, step) and the engine. Rewards follow the environment's truncation rule
(:mod:`environments.truncation`), as the validators' do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from engines.episodes import EpisodeRequest, Generate, play_episodes
from environments.base import Environment, Example
from environments.episode import MultiTurnEnvironment, episode_scores
from environments.render import ImageBlocks, prompt_ids
from environments.truncation import completion_scores, is_truncated
from toploc.sampling import sample_stream
from trainer.advantages import batch_advantages
from trainer.transport import TrainSample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Completion(Protocol):
    """What rollouts read from an engine's GenerationResult."""

    @property
    def completion_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...
    @property
    def finish_reason(self) -> str: ...


class RolloutEngine(Protocol):
    """The part of engines.base.Engine that rollouts use."""

    def generate(self, requests: list[Any]) -> Sequence[Completion]: ...

    def load_weights(self, checkpoint_dir: Path) -> None: ...


RequestFactory = Callable[..., Any]
"""``engines.base.GenerationRequest`` (keyword arguments as its fields)."""


@dataclass
class Rollout:
    example: Example
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    reward: float
    finish_reason: str
    truncated: bool = False
    """Cut at max_tokens: the last token is not EOS (the reward follows the environment's truncation rule)."""
    turns: int = 1
    """Policy turns: above 1 for an episode of a multi-turn environment."""


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of RL step ``step`` (distinct per step, within the sampler's 63 bits)."""
    return (seed * 1_000_003 + step) % (1 << 63)


def to_train_samples(rollouts: list[Rollout], group_size: int, normalize_std: bool = False) -> list[TrainSample]:
    """Training samples with group-relative advantages (groups are consecutive rollouts)."""
    advantages = batch_advantages([r.reward for r in rollouts], group_size, normalize_std)
    return [
        TrainSample(
            prompt_ids=r.prompt_ids,
            completion_ids=r.completion_ids,
            advantage=a,
            inference_logprobs=r.logprobs,
            reward=r.reward,
            images=r.example.images,
        )
        for r, a in zip(rollouts, advantages, strict=True)
    ]


@dataclass(frozen=True)
class EvalReport:
    task: str
    num_examples: int
    num_samples: int
    reward_mean: float
    accuracy: float
    """Fraction of samples whose reward reaches the task's success threshold (exact answers where the threshold
    is the top reward, as for the built-in tasks and reasoning-gym; a truncated sample never counts)."""
    stop_fraction: float
    """Fraction of samples that ended with EOS (not cut at max_tokens)."""
    mean_completion_tokens: float
    truncated_fraction: float = 0.0
    """Fraction of samples cut at max_tokens without EOS (valued by the environment's truncation rule)."""
    turns_mean: float = 1.0
    """Policy turns per sample (above 1 where a multi-turn environment answered the policy)."""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class RolloutSampler:
    """An engine bound to a task and its tokenizer, sampling at one temperature and token budget."""

    engine: RolloutEngine
    make_request: RequestFactory
    environment: Environment
    tokenizer: PreTrainedTokenizerBase
    temperature: float = 1.0
    max_tokens: int = 32
    end_token_ids: tuple[int, ...] | None = None
    """The tokens that end a completion; None: the tokenizer's EOS."""
    vision: ImageBlocks | None = None
    """A vision-language policy's image blocks (:class:`engines.vision.VisionInputs`): the prompts of an
    environment that shows images are written with them and the engine is given the images; None: text only."""

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.end_token_ids is not None:
            return self.end_token_ids
        eos = self.tokenizer.eos_token_id
        return (int(eos),) if eos is not None else ()

    def sample(self, examples: list[Example], num_samples: int, seed: int) -> list[Rollout]:
        """``num_samples`` completions of each example (prompt-major order), scored by the task; for a multi-turn
        environment, each an episode (:meth:`play`)."""
        if isinstance(self.environment, MultiTurnEnvironment):
            return self.play(self.environment, examples, num_samples, seed)
        eos_ids = self.eos_token_ids
        prompts = [prompt_ids(self.environment, ex, self.tokenizer, self.vision) for ex in examples]
        requests = [
            self.make_request(
                uid=f"{ex.index}-{j}",
                prompt_ids=prompts[i],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                seed=seed,
                stream=sample_stream(i, j),
                eos_token_ids=eos_ids,
                images=ex.images,
            )
            for i, ex in enumerate(examples)
            for j in range(num_samples)
        ]
        rollouts: list[Rollout] = []
        for k, result in enumerate(self.engine.generate(requests)):
            example = examples[k // num_samples]
            text = str(self.tokenizer.decode(result.completion_ids, skip_special_tokens=True))
            truncated = is_truncated(result.completion_ids, eos_ids)
            rollouts.append(
                Rollout(
                    example=example,
                    prompt_ids=prompts[k // num_samples],
                    completion_ids=list(result.completion_ids),
                    logprobs=list(result.logprobs),
                    text=text,
                    reward=completion_scores(self.environment, example, text, truncated).total,
                    finish_reason=result.finish_reason,
                    truncated=truncated,
                )
            )
        return rollouts

    def play(
        self, environment: MultiTurnEnvironment, examples: list[Example], num_samples: int, seed: int
    ) -> list[Rollout]:
        """``num_samples`` episodes of each example, played as workers play them (:mod:`engines.episodes`) and
        scored whole: a rollout's completion is every token the policy sampled, its text the last turn's. For
        evals; the trainer never trains on these (the environment's replies are not in them)."""
        requests = [
            EpisodeRequest(f"{ex.index}-{j}", ex, i, j) for i, ex in enumerate(examples) for j in range(num_samples)
        ]
        # episodes need the engine interface itself (its requests and results), as workers use it
        generate = cast(Generate, self.engine.generate)
        played = play_episodes(
            generate,
            environment,
            requests,
            self.tokenizer,
            seed=seed,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            eos_token_ids=self.eos_token_ids,
        )
        rollouts = []
        for request, episode in zip(requests, played, strict=True):
            assert episode.episode is not None
            turns = episode.turns
            rollouts.append(
                Rollout(
                    example=request.example,
                    prompt_ids=episode.prompt_ids[0],
                    completion_ids=[t for turn in turns for t in turn.completion_ids],
                    logprobs=[lp for turn in turns for lp in turn.logprobs],
                    text=episode.episode.messages[episode.episode.turn_starts[-1]].content,
                    reward=episode_scores(environment, episode.episode).total,
                    finish_reason=turns[-1].finish_reason,
                    truncated=episode.episode.ended_by == "truncated",
                    turns=len(turns),
                )
            )
        return rollouts

    def evaluate(self, num_examples: int, num_samples: int = 1, seed: int = 0) -> EvalReport:
        """Sampled reward and accuracy of the engine's current policy on the task's fixed eval set."""
        rollouts = self.sample(self.environment.eval_examples(num_examples), num_samples, seed)
        count = len(rollouts)
        return EvalReport(
            task=self.environment.name,
            num_examples=num_examples,
            num_samples=num_samples,
            reward_mean=sum(r.reward for r in rollouts) / count,
            accuracy=sum(r.reward >= self.environment.success_threshold for r in rollouts) / count,
            stop_fraction=sum(r.finish_reason == "stop" for r in rollouts) / count,
            mean_completion_tokens=sum(len(r.completion_ids) for r in rollouts) / count,
            truncated_fraction=sum(r.truncated for r in rollouts) / count,
            turns_mean=sum(r.turns for r in rollouts) / count,
        )
