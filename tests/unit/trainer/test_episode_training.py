"""Multi-turn environments on the trainer's side: SFT on model episodes trains the policy's turns only, evals play
episodes as workers do, and the local RL loop refuses them with the way to train them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines.base import GenerationRequest
from engines.hf import HFEngine
from environments.builtin.calculator import Calculator
from environments.config import EpisodeLimits
from protocol.errors import ConfigError
from tests.support.episodes import Counting, chat_policy
from trainer.config import RlConfig
from trainer.rl import run_rl
from trainer.rollout import RolloutSampler
from trainer.sft import episode_sft_samples, eval_samples


@pytest.fixture(scope="module")
def calculator_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from trainer.resolve import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path("builtin:small-qwen3")))


def test_sft_on_a_model_episode_trains_the_policys_turns_and_not_the_tools_reply(calculator_tokenizer: Any) -> None:
    tokenizer = calculator_tokenizer
    env = Calculator(seed=0)
    example = env.example(3)
    (sample,) = episode_sft_samples(env, tokenizer, example)  # the second prompt extends the first: one sample
    assert sample.sampled is not None and len(sample.sampled) == len(sample.completion_ids)
    trained = [t for t, flag in zip(sample.completion_ids, sample.sampled, strict=True) if flag]
    untrained = [t for t, flag in zip(sample.completion_ids, sample.sampled, strict=True) if not flag]
    end = tokenizer.eos_token
    assert tokenizer.decode(trained) == f"calc {example.data}{end}{example.answer}{end}"
    assert f"= {example.answer}" in tokenizer.decode(untrained)  # the tool's reply: context, never a target
    assert sample.num_trained == len(trained) < len(sample.completion_ids)
    assert tokenizer.decode(sample.prompt_ids).endswith("assistant\n")
    held_out = eval_samples(env, tokenizer, 4)
    assert len(held_out) == 4 and all(s.sampled is not None for s in held_out)


def test_an_eval_plays_episodes_and_scores_them_whole(tmp_path: Path) -> None:
    engine, tokenizer = chat_policy(tmp_path)
    env = Counting(limits=EpisodeLimits(max_turns=3))
    end = (tokenizer.convert_tokens_to_ids("<|im_end|>"), 1)  # the tiny model's biased id ends turns too
    sampler = RolloutSampler(engine, GenerationRequest, env, tokenizer, 1.0, 6, end_token_ids=end)
    examples = [env.example(i) for i in range(3)]
    rollouts = sampler.sample(examples, 2, seed=5)
    assert len(rollouts) == 6
    again = sampler.sample(examples, 2, seed=5)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in rollouts]  # seeded per turn
    # some episodes went past their first turn: each stopped turn ends with an end token
    assert max(sum(t in end for t in r.completion_ids) for r in rollouts) > 1
    for rollout in rollouts:
        assert rollout.reward == float(len(rollout.text))  # Counting scores the last turn's length
        assert len(rollout.logprobs) == len(rollout.completion_ids)
    report = sampler.evaluate(3, 2, seed=5)
    assert report.num_samples == 2 and report.mean_completion_tokens > 0


def test_the_local_rl_loop_refuses_a_multi_turn_environment(tmp_path: Path) -> None:
    config = RlConfig(
        trainer={"model": str(tmp_path / "never-loaded")},
        environment={"type": "builtin", "name": "calculator"},
        output_dir=tmp_path / "rl",
    )
    with pytest.raises(ConfigError, match=r"'calculator' is multi-turn: .* through the network"):
        run_rl(config, HFEngine.__new__(HFEngine), GenerationRequest)
