"""From accepted submissions to the trainer's samples: pure functions, no database, no files.

An accepted submission holds ``prompts_per_task`` prompts x ``group_size`` samples. Each
prompt's samples form one GRPO group: the rewards the validator recomputed from the task
(never the worker's word) are turned into group-relative advantages with the trainer's own
:func:`trainer.advantages.group_advantages`. A group whose rewards are all equal carries no
signal (:func:`has_signal`): with :attr:`BatchRules.no_signal_filter` it is left out of the samples.
Each sample carries the policy version that sampled it (a trainer that recomputes behaviour
log-probabilities uses it) and the worker's logprobs, which the trainer uses as behaviour
log-probabilities only under ``sampler``, where :attr:`BatchRules.checked_only` leaves out every
sample no validator recomputed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.ledger.step_metrics import NAMED_REWARD_PREFIX
from environments.base import Environment
from environments.episode import EpisodeError, MultiTurnEnvironment, episode_samples, issued_turn_prompts
from environments.images import Image
from environments.pinning import ImageMismatch, prompt_images
from environments.prompts import EnvironmentPrompts, PromptSource
from protocol.schemas import Rollout, SubmitRequest, TurnRollout, Verdict
from toploc.sampling import turn_stream
from trainer.advantages import group_advantages
from trainer.transport import Draws, TrainSample


@dataclass(frozen=True)
class AcceptedGroup:
    """One accepted submission, with what the batch needs from its task and its verdict."""

    submission_id: str
    policy_version: int
    prompt_token_ids: dict[int, list[int]]
    """Prompt index -> the task's prompt tokens (from the ledger, not from the worker)."""
    submission: SubmitRequest
    rewards: list[float]
    """Per rollout of ``submission``, in its order."""
    reward_components: dict[str, list[float]] = field(default_factory=dict)
    """Each named reward of the environment, per rollout (what ``rewards`` weighs together)."""
    example_indices: dict[int, int | None] = field(default_factory=dict)
    """Prompt index -> the environment example the task's prompt is (from the ledger)."""
    image_sha256: dict[int, list[str]] = field(default_factory=dict)
    """Prompt index -> the hashes of the images the task's prompt shows (from the ledger; empty: none)."""
    checked: frozenset[int] | None = None
    """The rollout positions of ``submission`` a validator recomputed (None: every one)."""
    seed: int | None = None
    """The sampling seed of the lease it answered (the ledger's), for a trainer that replays the draws."""


@dataclass(frozen=True)
class BatchRules:
    """How a step's accepted groups become samples."""

    normalize_std: bool = False
    """Divide group advantages by the group's reward std."""
    no_signal_filter: bool = False
    """Leave out groups (a prompt's samples) whose rewards are all equal."""
    checked_only: bool = False
    """Leave out samples no validator recomputed (their logprobs are the worker's word; ``sampler`` runs)."""


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ (equal rewards give every sample a zero advantage)."""
    return bool(rewards) and max(rewards) - min(rewards) > 1e-9


def prompt_rewards(submission: SubmitRequest, rewards: Sequence[float]) -> dict[int, list[float]]:
    """Each prompt's rewards, in sample order: its GRPO group's."""
    by_prompt: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for rollout, reward in zip(submission.rollouts, rewards, strict=True):
        by_prompt[rollout.prompt_index].append((rollout.sample_index, reward))
    return {prompt: [reward for _, reward in sorted(group)] for prompt, group in by_prompt.items()}


def signal_groups(submission: SubmitRequest, rewards: Sequence[float]) -> tuple[int, int]:
    """(groups, groups with signal) of an accepted submission."""
    groups = prompt_rewards(submission, rewards)
    return len(groups), sum(has_signal(group) for group in groups.values())


def verdict_rewards(verdict_json: str | None, num_rollouts: int) -> list[float] | None:
    """The validator's per-rollout rewards, or None when the verdict has none for every rollout."""
    if not verdict_json:
        return None
    rewards = Verdict.model_validate_json(verdict_json).rewards
    return list(rewards) if len(rewards) == num_rollouts else None


def accepted_group(
    submission_id: str, policy_version: int, prompts_json: str, body_json: str, verdict_json: str | None
) -> AcceptedGroup:
    """An :class:`AcceptedGroup` from the ledger's columns (task prompts, submission body, verdict)."""
    submission = SubmitRequest.model_validate_json(body_json)
    rewards = verdict_rewards(verdict_json, len(submission.rollouts))
    if rewards is None:
        raise ValueError(f"submission {submission_id} has no validator reward for each rollout")
    prompts: list[dict[str, Any]] = json.loads(prompts_json)
    components = Verdict.model_validate_json(verdict_json).reward_components if verdict_json else {}
    return AcceptedGroup(
        submission_id=submission_id,
        policy_version=policy_version,
        prompt_token_ids={int(p["prompt_index"]): list(p["token_ids"]) for p in prompts},
        submission=submission,
        rewards=rewards,
        reward_components={k: list(v) for k, v in components.items() if len(v) == len(submission.rollouts)},
        example_indices={int(p["prompt_index"]): p.get("example_index") for p in prompts},
        image_sha256={int(p["prompt_index"]): list(p.get("image_sha256", [])) for p in prompts},
    )


def scored_rollouts(group: AcceptedGroup, rules: BatchRules = BatchRules()) -> list[tuple[Rollout, float, float]]:
    """(rollout, reward, group advantage) of the rollouts of ``group`` that ``rules`` train on, prompt by prompt,
    each in sample order; advantages are computed over the whole group whichever samples are kept."""
    by_prompt: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for position, rollout in enumerate(group.submission.rollouts):
        by_prompt[rollout.prompt_index].append((rollout.sample_index, position))
    scored: list[tuple[Rollout, float, float]] = []
    for prompt_index in sorted(by_prompt):
        positions = [position for _, position in sorted(by_prompt[prompt_index])]
        rewards = [group.rewards[p] for p in positions]
        if rules.no_signal_filter and not has_signal(rewards):
            continue
        for position, advantage in zip(positions, group_advantages(rewards, rules.normalize_std), strict=True):
            if rules.checked_only and group.checked is not None and position not in group.checked:
                continue
            scored.append((group.submission.rollouts[position], group.rewards[position], advantage))
    return scored


TurnPrompts = Callable[[AcceptedGroup, Rollout], list[list[int]]]
"""(group, rollout) -> each policy turn's prompt ids, rebuilt by the trusted side (for a multi-turn run:
:func:`environments.episode.rebuild_episode` from the rollout's sampled turns)."""


def task_prompt(group: AcceptedGroup, rollout: Rollout) -> list[list[int]]:
    """The single turn's prompt: the task's, as the ledger issued it."""
    if rollout.later_turns:
        raise ValueError(f"submission {group.submission_id} has later turns in a single-turn run")
    return [group.prompt_token_ids[rollout.prompt_index]]


def episode_prompts(environment: MultiTurnEnvironment, tokenizer: Any, eos_token_ids: Sequence[int]) -> TurnPrompts:
    """Each policy turn's prompt ids, rebuilt from the rollout's sampled turns by replaying the run's environment
    (:func:`environments.episode.rebuild_episode`), the first checked against the task's prompt: a validator
    has replayed the same episode, so a failure here is an environment that does not replay."""

    def turn_prompts(group: AcceptedGroup, rollout: Rollout) -> list[list[int]]:
        example_index = group.example_indices.get(rollout.prompt_index)
        issued = group.prompt_token_ids[rollout.prompt_index]
        turn_ids = [turn.completion_ids for turn in (rollout, *rollout.later_turns)]
        try:
            return issued_turn_prompts(environment, example_index, issued, turn_ids, tokenizer, eos_token_ids)
        except EpisodeError as exc:
            raise ValueError(f"submission {group.submission_id}, prompt {rollout.prompt_index}: {exc}") from exc

    return turn_prompts


def run_turn_prompts(prompts: PromptSource, end_token_ids: Callable[[], Sequence[int]]) -> TurnPrompts:
    """How the loop gets each policy turn's prompt: the task's for a single-turn run; for a multi-turn run, the
    episode replayed from its sampled turns (:func:`episode_prompts`) with the run's environment, the tokenizer
    that rendered its prompts and the start checkpoint's end tokens (``end_token_ids()``, asked only then)."""
    if not isinstance(prompts, EnvironmentPrompts) or not isinstance(prompts.environment, MultiTurnEnvironment):
        return task_prompt
    return episode_prompts(prompts.environment, prompts.tokenizer, end_token_ids())


PromptImages = Callable[[AcceptedGroup, Rollout], tuple[Image, ...]]
"""(group, rollout) -> the images the rollout's prompt shows, rendered by the trusted side and checked against the
hashes the ledger pinned (:func:`rendered_images`)."""


def text_images(group: AcceptedGroup, rollout: Rollout) -> tuple[Image, ...]:
    """A text run's prompts show no images: none, and a ValueError for a prompt that pins some."""
    if group.image_sha256.get(rollout.prompt_index):
        raise ValueError(f"submission {group.submission_id}, prompt {rollout.prompt_index} pins images in a text run")
    return ()


def rendered_images(environment: Environment) -> PromptImages:
    """Each rollout's prompt images, rendered from its example with the run's environment and checked against the
    task's pinned hashes (:func:`environments.pinning.prompt_images`); a mismatch is an environment that does not
    render alike twice, a ValueError naming the submission."""

    def images(group: AcceptedGroup, rollout: Rollout) -> tuple[Image, ...]:
        index, pinned = group.example_indices.get(rollout.prompt_index), group.image_sha256.get(rollout.prompt_index)
        try:
            return prompt_images(environment, index, pinned or [])
        except ImageMismatch as exc:
            raise ValueError(f"submission {group.submission_id}, prompt {rollout.prompt_index}: {exc}") from exc

    return images


def run_prompt_images(prompts: PromptSource) -> PromptImages:
    """How the loop gets each rollout's prompt images: none for a text run; rendered with the run's environment
    (:func:`rendered_images`) when its prompts show images."""
    if isinstance(prompts, EnvironmentPrompts) and prompts.shows_images:
        return rendered_images(prompts.environment)
    return text_images


def train_samples(
    groups: list[AcceptedGroup],
    rules: BatchRules = BatchRules(),
    turn_prompts: TurnPrompts = task_prompt,
    images: PromptImages = text_images,
) -> list[TrainSample]:
    """Samples of every group, prompt by prompt, each prompt's samples in sample order, as ``rules`` keep them; a
    multi-turn episode gives one sample per run of turns that extend each other (:func:`episode_train_samples`).
    Each sample names its group (the group's index in ``groups``) and the policy version that sampled it."""
    return [
        replace(sample, policy_version=group.policy_version, group=index)
        for index, group in enumerate(groups)
        for rollout, reward, advantage in scored_rollouts(group, rules)
        for sample in episode_train_samples(
            turn_prompts(group, rollout), rollout, reward, advantage, images(group, rollout), group.seed
        )
    ]


def episode_train_samples(
    prompts: list[list[int]],
    rollout: Rollout,
    reward: float,
    advantage: float,
    images: tuple[Image, ...] = (),
    seed: int | None = None,
) -> list[TrainSample]:
    """The training samples of one rollout from its turns' trusted prompts (the first showing ``images``): only
    the tokens the policy sampled carry loss (:attr:`TrainSample.sampled`), each with the logprob the worker
    claimed; a single turn gives one sample whose every completion token was sampled (``sampled`` None). With the
    lease's ``seed``, each sample says how its tokens were drawn (:class:`trainer.transport.Draws`)."""
    turns: list[TurnRollout] = [rollout, *rollout.later_turns]
    samples = []
    for episode_sample in episode_samples(prompts, [turn.completion_ids for turn in turns]):
        completion = episode_sample.completion_ids
        sampled = episode_sample.completion_sampled
        logprobs = iter([lp for number in episode_sample.turns for lp in turns[number].logprobs])
        drawn = iter(
            [
                (turn_stream(rollout.prompt_index, rollout.sample_index, number), position)
                for number in episode_sample.turns
                for position in range(len(turns[number].completion_ids))
            ]
        )
        flags = sampled if sampled is not None else [True] * len(completion)
        where = [next(drawn) if flag else (-1, -1) for flag in flags]
        samples.append(
            TrainSample(
                prompt_ids=episode_sample.prompt_ids,
                completion_ids=completion,
                advantage=advantage,
                inference_logprobs=[next(logprobs) if flag else 0.0 for flag in flags],
                reward=reward,
                sampled=sampled,
                images=images,
                draws=None if seed is None else Draws(seed, [s for s, _ in where], [p for _, p in where]),
            )
        )
    return samples


def named_reward_means(groups: list[AcceptedGroup]) -> dict[str, float]:
    """The mean of each named reward over the groups' rollouts that carry it."""
    values: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        for name, series in group.reward_components.items():
            values[name].extend(series)
    return {f"{NAMED_REWARD_PREFIX}{name}": sum(v) / len(v) for name, v in sorted(values.items()) if v}


def sampled_tokens(rollout: Rollout) -> int:
    """The tokens the policy sampled in a rollout, over all its turns (environment tokens are not counted)."""
    return len(rollout.completion_ids) + sum(len(turn.completion_ids) for turn in rollout.later_turns)


def rollout_stats(groups: list[AcceptedGroup]) -> dict[str, float]:
    """How the batch's rollouts ended: mean completion length (tokens the policy sampled, every turn of an
    episode), policy turns per rollout, and the fractions that stopped (the last turn ended with EOS) and were
    truncated (cut at ``max_tokens`` without EOS). Every turn of an accepted submission passed the validators'
    termination check (``stop`` ends with an EOS id, ``length`` has exactly ``max_tokens`` tokens), so its
    finish reason is the ledger's word, not the worker's."""
    rollouts = [rollout for group in groups for rollout in group.submission.rollouts]
    count = len(rollouts)
    if not count:
        return {"completion_tokens_mean": 0.0, "turns_mean": 0.0, "stop_fraction": 0.0, "truncated_fraction": 0.0}
    last = [(r.later_turns or [r])[-1] for r in rollouts]
    return {
        "completion_tokens_mean": sum(sampled_tokens(r) for r in rollouts) / count,
        "turns_mean": sum(1 + len(r.later_turns) for r in rollouts) / count,
        "stop_fraction": sum(turn.finish_reason == "stop" for turn in last) / count,
        "truncated_fraction": sum(turn.finish_reason == "length" for turn in last) / count,
    }


def sampled_fraction(samples: Sequence[TrainSample]) -> float:
    """The share of the batch's completion tokens (what follows each sample's prompt) that the policy sampled and
    the loss covers; below 1 where episodes carry environment replies between their turns."""
    total = sum(len(sample.completion_ids) for sample in samples)
    return sum(sample.num_trained for sample in samples) / total if total else 1.0


def batch_summary(
    groups: list[AcceptedGroup], trained_version: int, set_aside: Sequence[AcceptedGroup] = ()
) -> dict[str, float]:
    """Reward, size, staleness (versions behind the policy being trained) and how the rollouts ended
    (:func:`rollout_stats`) of a step's batch, and the share of groups, its own and those ``set_aside`` for it,
    that carried no signal."""
    rewards = [reward for group in groups for reward in group.rewards]
    lags = [trained_version - group.policy_version for group in groups]
    counts = [signal_groups(group.submission, group.rewards) for group in [*groups, *set_aside]]
    num_groups = sum(total for total, _ in counts)
    return {
        **named_reward_means(groups),
        **rollout_stats(groups),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "num_samples": float(len(rewards)),
        "num_completion_tokens": float(sum(sampled_tokens(r) for group in groups for r in group.submission.rollouts)),
        "staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "staleness_max": float(max(lags, default=0)),
        "zero_signal_fraction": (num_groups - sum(signal for _, signal in counts)) / num_groups if num_groups else 0.0,
        "num_set_aside": float(len(set_aside)),
    }
