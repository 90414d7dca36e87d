"""Auditing multi-turn episodes played by a worker with the HF engine: the validator rebuilds every prompt and
environment reply from the sampled tokens, checks each turn's draw on its own stream, and scores the episode.
A worker that plays a different environment, stops an episode early, plays past its end, passes environment
tokens off as sampled, or sends turns to a single-turn run is rejected with the reason."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engines.hf import HFEngine
from environments.config import EpisodeLimits
from environments.episode import EpisodeRun, MultiTurnEnvironment, rebuild_episode
from protocol.schemas import PendingSubmission, SubmitRequest, Task, TurnRollout
from tests.support.adversary import signed_pending
from tests.support.episodes import Counting, chat_policy
from validator.audit import Episodes, audit_submission, audit_submissions_safely, environment_reward_fn
from worker.episodes import EpisodePlayer, build_episode_submission

LIMITS = EpisodeLimits(max_turns=3)
EXAMPLES = [4, 9]
GROUP_SIZE = 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[HFEngine, Any]:
    return chat_policy(tmp_path_factory.mktemp("chat-policy"))


def eos_of(tokenizer: Any) -> tuple[int, ...]:
    return (tokenizer.convert_tokens_to_ids("<|im_end|>"), 1)


def make_task(env: MultiTurnEnvironment, tokenizer: Any) -> Task:
    """A task of the examples' first prompts, as the coordinator renders them."""
    prompts = [
        {
            "prompt_index": i,
            "token_ids": EpisodeRun(env, env.example(index)).prompt_ids(tokenizer),
            "example_index": index,
        }
        for i, index in enumerate(EXAMPLES)
    ]
    return Task.model_validate(
        {
            "task_id": "t-1",
            "lease_id": "l-1",
            "task_name": env.name,
            "prompts": prompts,
            "group_size": GROUP_SIZE,
            "sampling": {"temperature": 1.0, "max_tokens": 6},
            "policy_version": 0,
            "sampling_seed": 777,
            "deadline": time.time() + 60,
        }
    )


def played_submission(engine: HFEngine, tokenizer: Any, task: Task, env: MultiTurnEnvironment) -> SubmitRequest:
    played = EpisodePlayer(env, tokenizer).play(engine.generate, task, eos_of(tokenizer))
    return build_episode_submission(task, engine.name, played)


def audit(policy: tuple[HFEngine, Any], item: PendingSubmission, episodes: bool = True) -> Any:
    engine, tokenizer = policy
    env = Counting(limits=LIMITS)
    eos = eos_of(tokenizer)
    return audit_submission(
        item,
        engine,
        eos,
        reward_fn=environment_reward_fn(env, tokenizer, eos),
        episodes=Episodes(env, tokenizer) if episodes else None,
    )[0]


def test_honest_episodes_are_accepted_and_scored_whole(policy: tuple[HFEngine, Any]) -> None:
    engine, tokenizer = policy
    task = make_task(Counting(limits=LIMITS), tokenizer)
    submission = played_submission(engine, tokenizer, task, Counting(limits=LIMITS))
    assert any(r.later_turns for r in submission.rollouts)
    verdict = audit(policy, signed_pending(task, submission))
    assert verdict.accepted, verdict.reasons
    assert len(verdict.rewards) == len(EXAMPLES) * GROUP_SIZE
    single_turn = audit(policy, signed_pending(task, submission), episodes=False)
    assert not single_turn.accepted
    assert "policy turns in a run whose environment is single-turn" in single_turn.reasons[0]


def test_a_worker_that_plays_another_environment_is_rejected_at_the_turn_that_differs(
    policy: tuple[HFEngine, Any],
) -> None:
    engine, tokenizer = policy
    task = make_task(Counting(limits=LIMITS), tokenizer)
    tampered = played_submission(engine, tokenizer, task, Counting(heard="saw", limits=LIMITS))  # other tool output
    verdict = audit(policy, signed_pending(task, tampered))
    assert not verdict.accepted
    assert all(" turn " in reason and " turn 0" not in reason for reason in verdict.reasons), verdict.reasons


def test_episodes_cut_short_or_played_past_their_end_are_rejected(policy: tuple[HFEngine, Any]) -> None:
    engine, tokenizer = policy
    task = make_task(Counting(limits=LIMITS), tokenizer)
    honest = played_submission(engine, tokenizer, task, Counting(limits=LIMITS))
    position = next(i for i, r in enumerate(honest.rollouts) if len(r.later_turns) == LIMITS.max_turns - 1)
    rollouts = list(honest.rollouts)
    rollouts[position] = rollouts[position].model_copy(update={"later_turns": rollouts[position].later_turns[:-1]})
    verdict = audit(policy, signed_pending(task, honest.model_copy(update={"rollouts": rollouts})))
    assert not verdict.accepted
    assert "episode: the episode stops after policy turn 2, but the environment replied" in verdict.reasons[0]

    longer = played_submission(engine, tokenizer, task, Counting(limits=EpisodeLimits(max_turns=4)))
    verdict = audit(policy, signed_pending(task, longer))
    assert not verdict.accepted
    assert any("policy turns, over the episode limit of 3" in reason for reason in verdict.reasons), verdict.reasons


def test_environment_tokens_passed_off_as_sampled_are_rejected(policy: tuple[HFEngine, Any]) -> None:
    """The worker folds the environment's reply and turn 1 into turn 0, as if the policy had sampled it all."""
    engine, tokenizer = policy
    task = make_task(Counting(limits=LIMITS), tokenizer)
    honest = played_submission(engine, tokenizer, task, Counting(limits=LIMITS))
    position, rollout = next((i, r) for i, r in enumerate(honest.rollouts) if r.later_turns)
    eos = eos_of(tokenizer)
    turn_ids = [rollout.completion_ids, *(t.completion_ids for t in rollout.later_turns)]
    env = Counting(limits=LIMITS)
    _episode, prompts = rebuild_episode(env, env.example(EXAMPLES[0]), turn_ids, tokenizer, eos)
    between = prompts[1][len(prompts[0]) + len(rollout.completion_ids) :]
    folded_ids = [*rollout.completion_ids, *between, *rollout.later_turns[0].completion_ids]
    folded = TurnRollout(
        completion_ids=folded_ids,
        logprobs=[*rollout.logprobs, *([-0.1] * len(between)), *rollout.later_turns[0].logprobs],
        finish_reason=rollout.later_turns[0].finish_reason,
        proof_b64=rollout.later_turns[0].proof_b64,
    )
    cheat = rollout.model_copy(update={**dict(folded), "later_turns": rollout.later_turns[1:]})
    rollouts = list(honest.rollouts)
    rollouts[position] = cheat
    big = task.model_copy(update={"sampling": task.sampling.model_copy(update={"max_tokens": len(folded_ids)})})
    verdict = audit(policy, signed_pending(big, honest.model_copy(update={"rollouts": rollouts})))
    assert not verdict.accepted
    label = f"rollout p{cheat.prompt_index}/s{cheat.sample_index}"
    assert any(reason.startswith(label) for reason in verdict.reasons), verdict.reasons


class Failing(Counting):
    """The run's environment breaks on replaying turn 1: the run's matter, never the worker's."""

    def reply(self, example: Any, transcript: tuple[Any, ...]) -> tuple[Any, ...] | None:
        raise ZeroDivisionError("division by zero")


def test_an_environment_that_fails_to_reply_is_an_environment_error_not_a_rejection(
    policy: tuple[HFEngine, Any],
) -> None:
    engine, tokenizer = policy
    task = make_task(Counting(limits=LIMITS), tokenizer)
    honest = signed_pending(task, played_submission(engine, tokenizer, task, Counting(limits=LIMITS)))
    eos = eos_of(tokenizer)
    env = Failing(limits=LIMITS)
    ((verdict, _),) = audit_submissions_safely(
        [honest],
        engine,
        eos,
        reward_fn=environment_reward_fn(env, tokenizer, eos),
        episodes=Episodes(env, tokenizer),
    )
    assert not verdict.accepted and not verdict.rewards
    assert verdict.environment_error is not None
    assert "the environment's reply failed: ZeroDivisionError: division by zero" in verdict.environment_error
