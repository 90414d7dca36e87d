"""Built-in tasks: deterministic examples, eval set apart from training, rewards."""

from __future__ import annotations

import pytest

from trainer.tasks import Example, Task, get_task, register_task, task_names
from trainer.tasks.reverse_text import lcs_length, lcs_ratio


def test_examples_are_pure_functions_of_seed_and_index() -> None:
    for name in task_names():
        first, second = get_task(name, seed=3), get_task(name, seed=3)
        assert [first.example(i) for i in range(20)] == [second.example(i) for i in range(20)]
        assert [first.example(i) for i in range(20)] != [get_task(name, seed=4).example(i) for i in range(20)]
        assert first.example(5) == first.example(5)


def test_eval_set_is_fixed_and_separate() -> None:
    task = get_task("reverse_text")
    evals = task.eval_examples(50)
    assert evals == get_task("reverse_text").eval_examples(50)
    train_prompts = {task.example(i).prompt for i in range(2000)}
    overlap = sum(ex.prompt in train_prompts for ex in evals)
    assert overlap <= 1


@pytest.mark.parametrize(
    ("a", "b", "length"), [("", "", 0), ("abc", "", 0), ("abcde", "ace", 3), ("abc", "cba", 1), ("hello", "hello", 5)]
)
def test_lcs_length(a: str, b: str, length: int) -> None:
    assert lcs_length(a, b) == length
    assert lcs_length(b, a) == length


def test_reverse_text_reward() -> None:
    task = get_task("reverse_text")
    example = Example(index=0, prompt="reverse: abc de\n", answer="ed cba")
    assert task.reward(example, "ed cba") == 1.0
    assert task.reward(example, " ed cba \n") == 1.0
    assert task.reward(example, "abc de") == pytest.approx(lcs_ratio("abc de", "ed cba"))
    assert task.reward(example, "ed cb") == pytest.approx(2 * 5 / 11)
    assert task.reward(example, "") == 0.0
    ex = task.example(3)
    assert ex.prompt.startswith("reverse: ") and ex.prompt.endswith("\n")
    assert ex.answer == ex.prompt.removeprefix("reverse: ").removesuffix("\n")[::-1]


def test_arithmetic_reward_is_exact() -> None:
    task = get_task("arithmetic")
    for i in range(50):
        ex = task.example(i)
        left, op, right = ex.prompt[:-1].partition("+") if "+" in ex.prompt else ex.prompt[:-1].partition("-")
        expected = int(left) + int(right) if op == "+" else int(left) - int(right)
        assert ex.answer == str(expected)
        assert task.reward(ex, ex.answer) == 1.0
        assert task.reward(ex, f" {ex.answer}") == 1.0
        assert task.reward(ex, ex.answer + "0") == 0.0


def test_sft_pairs_come_from_the_training_stream() -> None:
    task = get_task("arithmetic")
    assert task.sft_pairs(10, 2) == [(task.example(i).prompt, task.example(i).answer) for i in (10, 11)]


def test_users_can_register_tasks() -> None:
    class Echo(Task):
        name = "echo_test_task"

        def example(self, index: int) -> Example:
            return Example(index=index, prompt=f"say {index}:", answer=str(index))

        def reward(self, example: Example, completion: str) -> float:
            return float(completion.strip() == example.answer)

    register_task("echo_test_task", Echo)
    assert get_task("echo_test_task").reward(Example(0, "say 0:", "0"), "0") == 1.0
    with pytest.raises(ValueError, match="already registered"):
        register_task("echo_test_task", Echo)
    with pytest.raises(ValueError, match="known tasks"):
        get_task("nope")
