"""Held out means held out: every adapter's eval prompts are ones no training index produces, compared by content."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from environments.base import Environment
from environments.builtin import BUILTIN, builtin_environment
from environments.config import EnvironmentConfig
from environments.held_out import HELD_OUT_PERCENT, example_key, is_held_out
from environments.loader import load_checked_environment, load_environment
from protocol.errors import ConfigError
from tests.unit.environments.test_environments import TASKSETS_DIR, V0_ECHO

NUM_EVAL = 256


def parse(section: dict[str, Any]) -> EnvironmentConfig:
    return TypeAdapter(EnvironmentConfig).validate_python(section)


def train_and_eval(environment: Environment, num_train: int, num_eval: int = NUM_EVAL) -> tuple[set[str], set[str]]:
    train = {example_key(environment.example(i)) for i in range(num_train)}
    return train, {example_key(example) for example in environment.eval_examples(num_eval)}


def test_the_content_partition_holds_out_a_tenth_whatever_the_seed() -> None:
    prompts = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    held_out = sum(is_held_out(p) for p in prompts)
    assert abs(held_out / len(prompts) - HELD_OUT_PERCENT / 100) < 0.01
    assert is_held_out("x") == is_held_out("x")


@pytest.mark.parametrize("name", sorted(BUILTIN))
@pytest.mark.parametrize("seed", [0, 7])
def test_builtin_eval_prompts_are_never_training_prompts(name: str, seed: int) -> None:
    environment = builtin_environment(name, seed)
    train, held_out = train_and_eval(environment, 20_000)
    assert not train & held_out
    assert len(held_out) > NUM_EVAL // 2  # a real eval set, not a handful repeated
    # the proof for every index and seed: training draws only one side of the partition, eval only the other
    assert not any(is_held_out(p) for p in train) and all(is_held_out(p) for p in held_out)
    other_seed = builtin_environment(name, seed + 1)
    assert not {example_key(other_seed.example(i)) for i in range(5000)} & held_out


@pytest.mark.parametrize(
    ("dataset", "size", "args"),
    [("spell_backward", 1000, {"min_word_len": 3, "max_word_len": 5}), ("chain_sum", 500, {})],
)
def test_reasoning_gym_eval_questions_are_never_training_questions(
    dataset: str, size: int, args: dict[str, Any]
) -> None:
    environment = load_checked_environment(
        parse({"type": "reasoning_gym", "dataset": dataset, "size": size, "seed": 1, "args": args})
    )
    train, held_out = train_and_eval(environment, size)  # the whole training split
    assert not train & held_out
    assert len(held_out) > 10
    # eval example i used to be training example i + 1 (the eval split was seeded seed + 1)
    shifted = [environment.example(i).prompt for i in range(1, 6)]
    assert [environment.eval_example(i).prompt for i in range(5)] != shifted


def test_verifiers_v1_eval_tasks_are_never_training_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    section = {"type": "verifiers", "taskset": "vf_echo_taskset", "args": {"count": 8}, "eval_fraction": 0.25}
    environment = load_checked_environment(parse(section))
    train, held_out = train_and_eval(environment, 8)
    assert held_out and not train & held_out
    # a split too small to hold anything out used to evaluate on the training tasks
    with pytest.raises(ConfigError, match="holds out no task whose prompt training never asks"):
        load_environment(parse({**section, "eval_fraction": 0.1}))
    # 16 tasks of 8 words: the last quarter asks what training asks, so nothing is held out
    with pytest.raises(ConfigError, match="holds out no task"):
        load_environment(parse({**section, "args": {"count": 16}}))


def test_verifiers_v0_eval_rows_are_never_training_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    environment = load_checked_environment(parse(V0_ECHO))
    train, held_out = train_and_eval(environment, 6)
    assert len(held_out) == 2 and not train & held_out
    # an eval_dataset repeating training rows (words wrap after 8) holds nothing out
    with pytest.raises(ConfigError, match="holds out no task"):
        load_environment(parse({**V0_ECHO, "args": {"count": 8}}))


def test_python_environment_eval_prompts_must_not_be_training_prompts() -> None:
    environment = load_checked_environment(parse({"type": "python", "target": "tests.envs.words:KeywordEnvironment"}))
    train, held_out = train_and_eval(environment, 4096)
    assert held_out and not train & held_out
    with pytest.raises(ConfigError, match=r"'leaky': eval example 0 is training example \d+"):
        load_environment(parse({"type": "python", "target": "tests.envs.words:LeakyEnvironment"}))
