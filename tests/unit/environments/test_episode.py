"""Multi-turn episodes: the calculator tool, replaying an episode from its policy turns alone, and the training
samples (merged turns, sampled-token masks) the trusted side derives from the chat template."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from environments.base import ChatMessage, Example, Scores
from environments.builtin.calculator import Calculator, CalculatorError, calculate
from environments.config import EpisodeLimits
from environments.episode import (
    EnvironmentReplyError,
    EpisodeError,
    MultiTurnEnvironment,
    PolicyTurn,
    episode_samples,
    replay,
    turn_prompt_ids,
)

LIMITS = EpisodeLimits(max_turns=3)


def calculator() -> Calculator:
    """The calculator with a three-turn limit."""
    env = Calculator(seed=0)
    env.limits = LIMITS
    return env


def test_the_calculator_computes_with_precedence_and_refuses_what_it_does_not_take() -> None:
    assert calculate("347*29+58") == 347 * 29 + 58
    assert calculate(" 2 + 3*(4 - 6) ") == -4
    assert calculate("-(7)*-2") == 14
    for bad, reason in [
        ("2**8", "unexpected"),
        ("import os", "cannot read"),
        ("(1+2", "missing"),
        ("9" * 17, "too large"),
        ("1+" * 40 + "1", "longer than"),
        ("3+", "ends too early"),
    ]:
        with pytest.raises(CalculatorError, match=reason):
            calculate(bad)


def test_an_honest_episode_is_replayed_with_the_tools_own_output() -> None:
    env = calculator()
    example = env.example(0)
    assert isinstance(example.prompt, tuple) and example.answer is not None
    episode = replay(env, example, [PolicyTurn(f"calc {example.data}", False), PolicyTurn(example.answer, False)])
    assert episode.ended_by == "environment"
    assert [m.role for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
    assert episode.messages[2].content == f"= {example.answer}"
    assert episode.turn_starts == (1, 3)
    assert env.score_episode(example, episode.messages).total == 1.0
    wrong = replay(env, example, [PolicyTurn("calc 1+", False), PolicyTurn("12", False)])
    assert wrong.messages[2].content == "error: expression ends too early"
    assert env.score_episode(example, wrong.messages).total == 0.0
    # replaying twice gives the same bytes: the reply is a function of the transcript alone
    again = replay(env, example, [PolicyTurn(f"calc {example.data}", False), PolicyTurn(example.answer, False)])
    assert again == episode


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        ([], "at least one policy turn"),
        (["42", "calc 1+1"], "ended the episode after policy turn 1 of 2"),
        (["calc 1+1"], "stops after policy turn 1, but the environment replied"),
        (["calc 1", "calc 2", "calc 3", "4"], "over the episode limit of 3"),
    ],
)
def test_turns_the_environment_would_not_have_taken_are_refused(turns: list[str], reason: str) -> None:
    env = calculator()
    with pytest.raises(EpisodeError, match=reason):
        replay(env, env.example(0), [PolicyTurn(t, False) for t in turns])


def test_a_cut_turn_ends_the_episode_and_the_turn_limit_ends_it_too() -> None:
    env = calculator()
    example = env.example(1)
    cut = replay(env, example, [PolicyTurn("calc 1+1", True)])
    assert cut.ended_by == "truncated" and len(cut.messages) == 2
    with pytest.raises(EpisodeError, match="cut at the token budget"):
        replay(env, example, [PolicyTurn("calc 1+1", True), PolicyTurn("2", False)])
    limited = replay(
        env, example, [PolicyTurn("calc 1", False), PolicyTurn("calc 2", False), PolicyTurn("calc 3", False)]
    )
    assert limited.ended_by == "turn_limit"
    assert [m.role for m in limited.messages][-1] == "assistant"


class Misbehaving(MultiTurnEnvironment):
    name = "misbehaving"

    def __init__(self, reply: tuple[ChatMessage, ...], delay_s: float = 0.0) -> None:
        self._reply, self._delay_s = reply, delay_s

    def example(self, index: int) -> Example:
        return Example(index=index, prompt="go")

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        time.sleep(self._delay_s)
        return self._reply

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("none", 0.0)


class Raising(Misbehaving):
    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        raise KeyError("missing")


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (Raising(()), "the environment's reply failed: KeyError: 'missing'"),
        (Misbehaving((ChatMessage("tool", "x" * 2001),)), "2001 characters, over the 2000 limit"),
        (Misbehaving((ChatMessage("assistant", "I am the policy"),)), "must be one or more"),
        (Misbehaving(()), "must be one or more"),
        (Misbehaving((ChatMessage("tool", "late"),), delay_s=0.05), "to reply, over the 0.01 s limit"),
    ],
)
def test_an_environment_over_its_limits_is_its_own_fault(env: Misbehaving, reason: str) -> None:
    # A tight time limit only where time is the fault: a loaded machine can take longer than 0.01 s to return at once.
    env.limits = EpisodeLimits(max_turns=3, reply_time_s=0.01 if env._delay_s else 5.0)
    with pytest.raises(EnvironmentReplyError, match=reason):
        replay(env, env.example(0), [PolicyTurn("a", False), PolicyTurn("b", False)])


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A small ChatML tokenizer trained here on the calculator's own text, like the built-in chat models'."""
    from transformers import AutoTokenizer

    from trainer.tokenizer import CHAT_TEMPLATE, save_hf_tokenizer, train_tokenizer

    env = calculator()
    examples = [env.example(i) for i in range(200)]
    corpus = [
        f"{m.content} calc {e.data} = {e.answer}" for e in examples for m in e.prompt if isinstance(m, ChatMessage)
    ]
    directory: Path = tmp_path_factory.mktemp("chat-tokenizer")
    save_hf_tokenizer(train_tokenizer(corpus, 400), directory, 512, CHAT_TEMPLATE)
    return AutoTokenizer.from_pretrained(str(directory))


def test_turns_that_extend_each_other_merge_and_only_sampled_tokens_are_trained(chat_tokenizer: Any) -> None:
    env = calculator()
    example = env.example(2)
    texts = [f"calc {example.data}", str(example.answer)]
    end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    completions = [[*chat_tokenizer.encode(t, add_special_tokens=False), end] for t in texts]
    episode = replay(env, example, [PolicyTurn(t, False) for t in texts])
    prompts = turn_prompt_ids(env, episode, chat_tokenizer)
    (sample,) = episode_samples(prompts, completions)
    assert sample.turns == (0, 1)
    assert sample.token_ids[: len(prompts[1])] == tuple(prompts[1])
    sampled = [t for t, s in zip(sample.token_ids, sample.sampled, strict=True) if s]
    assert sampled == completions[0] + completions[1]
    between = chat_tokenizer.decode(sample.token_ids[len(prompts[0]) + len(completions[0]) : len(prompts[1])])
    assert between == f"\n<|im_start|>tool\n= {example.answer}<|im_end|>\n<|im_start|>assistant\n"
    assert sample.prompt_len == len(prompts[0])


def test_a_turn_whose_prompt_does_not_extend_the_last_starts_a_sample_of_its_own() -> None:
    prompts = [[1, 2], [1, 2, 3, 4, 9], [7, 7]]
    completions = [[3, 4], [5], [8]]
    first, second = episode_samples(prompts, completions)
    assert first.token_ids == (1, 2, 3, 4, 9, 5) and first.sampled == (False, False, True, True, False, True)
    assert second.token_ids == (7, 7, 8) and second.turns == (2,)
    # a completion that re-tokenizes differently in the next prompt breaks the extension too
    (a, b) = episode_samples([[1], [1, 6, 9]], [[5], [8]])
    assert a.token_ids == (1, 5) and b.token_ids == (1, 6, 9, 8) and b.sampled == (False, False, False, True)
