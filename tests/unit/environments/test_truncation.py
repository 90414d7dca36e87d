"""The truncation rule and answer extraction: a completion cut at max_tokens earns no credit, trailing text none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from environments.base import Example, Scores
from environments.builtin import builtin_environment
from environments.config import EnvironmentConfig
from environments.loader import environment_identity, load_environment
from environments.truncation import completion_scores, is_truncated, no_credit
from validator.audit import environment_reward_fn

EOS = 0


class CharTokenizer:
    """Token ``ord(c)`` per character, EOS id 0 (a special token)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join("" if i == EOS and skip_special_tokens else chr(i) for i in ids)


def parse(section: dict[str, Any]) -> EnvironmentConfig:
    return TypeAdapter(EnvironmentConfig).validate_python(section)


def test_truncated_means_the_last_token_is_no_end_token() -> None:
    assert not is_truncated([5, 6, EOS], [EOS])
    assert is_truncated([5, 6, 7], [EOS])
    assert not is_truncated([5, 9], [EOS, 9])
    assert is_truncated([], [EOS])


def test_no_credit_keeps_penalties_only() -> None:
    scores = Scores({"exact": 1.0, "format": -0.5, "length": 0.2}, {"exact": 1.0, "format": 1.0, "length": -1.0})
    cut = no_credit(scores)
    assert dict(cut.rewards) == {"exact": 0.0, "format": -0.5, "length": 0.2}
    assert cut.weights == scores.weights and cut.total == pytest.approx(-0.7)
    assert no_credit(Scores.single("lcs_ratio", 0.8)).total == 0.0


def test_a_truncated_completion_scores_the_minimum_and_a_stopped_one_is_unaffected() -> None:
    environment = load_environment(parse({"type": "builtin", "name": "arithmetic"}))
    assert environment.truncated == "minimum"
    example = environment.example(0)
    assert completion_scores(environment, example, example.answer or "", truncated=False).total == 1.0
    assert completion_scores(environment, example, example.answer or "", truncated=True).total == 0.0
    keeps_score = load_environment(parse({"type": "builtin", "name": "arithmetic", "truncated": "score"}))
    assert completion_scores(keeps_score, example, example.answer or "", truncated=True).total == 1.0


def test_the_validator_recomputes_rewards_under_the_rule() -> None:
    environment = load_environment(parse({"type": "builtin", "name": "reverse_text"}))
    example = environment.example(3)
    answer_ids = [ord(c) for c in example.answer or ""]
    reward = environment_reward_fn(environment, CharTokenizer(), [EOS])
    assert reward(3, [[*answer_ids, EOS]]).total == 1.0  # stopped: scored as the text
    padded = answer_ids + [ord("x")] * 5  # cut at max_tokens: would score above 0
    assert environment.score(example, "".join(map(chr, padded))).total > 0.5
    assert reward(3, [padded]) == Scores.single("lcs_ratio", 0.0)
    environment.truncated = "score"
    assert reward(3, [padded]).total == environment.score(example, "".join(map(chr, padded))).total


def test_the_samples_of_a_group_share_one_draw_of_their_example() -> None:
    environment = load_environment(parse({"type": "builtin", "name": "reverse_text"}))
    drawn: list[int] = []
    draw = environment.example

    def counted(index: int) -> Example:
        drawn.append(index)
        return draw(index)

    environment.example = counted  # type: ignore[method-assign]
    reward = environment_reward_fn(environment, CharTokenizer(), [EOS])
    answers = {i: [ord(c) for c in draw(i).answer or ""] + [EOS] for i in (3, 4)}
    scores = [reward(i, [answers[3 if n < 2 else 4]]).total for n, i in enumerate((3, 3, 4, 4, 3))]
    assert drawn == [3, 4, 3]  # once per run of one index, again when it comes back
    assert scores[:4] == [1.0, 1.0, 1.0, 1.0] and scores[4] < 1.0  # p4's answer is not p3's


def test_the_rule_is_a_signed_environment_setting() -> None:
    section = {"type": "reasoning_gym", "dataset": "spell_backward"}
    assert parse(section).truncated == "minimum"
    minimum, score = (
        environment_identity(parse(section)),
        environment_identity(parse({**section, "truncated": "score"})),
    )
    assert minimum.arguments["truncated"] == "minimum" and minimum.config_hash != score.config_hash
    with pytest.raises(ValidationError):
        parse({**section, "truncated": "maximum"})


@pytest.mark.parametrize("name", ["reverse_text", "arithmetic"])
def test_builtin_text_after_the_answer_earns_nothing(name: str) -> None:
    environment = builtin_environment(name)
    for i in range(20):
        example = environment.example(i)
        answer = example.answer or ""
        for given in (answer, answer[:-1] or "x", "0"):
            alone = environment.reward(example, given)
            for junk in ("\n" + answer, "\n\n" + answer * 3, "\n12+3=15"):
                assert environment.reward(example, given + junk) == alone


def test_reasoning_gym_scores_the_answers_lines_only() -> None:
    environment = load_environment(
        parse({"type": "reasoning_gym", "dataset": "spell_backward", "size": 200, "args": {"max_word_len": 5}})
    )
    for i in range(20):
        example = environment.example(i)
        answer = example.answer or ""
        for given in (answer, answer[:2], "zz"):
            alone = environment.reward(example, given)
            assert environment.reward(example, f"\n{given}\n{answer}{answer}") == alone
    multi = Example(index=0, prompt="q", answer="ab\ncd", data={"answer": "ab\ncd", "question": "q", "metadata": {}})
    reasoning_gym = environment._train  # type: ignore[attr-defined]
    assert environment.reward(multi, "ab\ncd\nmore") == reasoning_gym.score_answer(answer="ab\ncd", entry=multi.data)


@pytest.mark.parametrize("fault", ["nan", "inf", "text"])
def test_the_rule_never_hides_an_environment_fault(fault: str) -> None:
    """Zeroing a cut completion's rewards must not turn an environment's NaN, inf or string into a clean 0."""
    from tests.envs.words import FaultyEnvironment

    environment = FaultyEnvironment(fault=fault, max_chars=-1)
    example = environment.example(0)
    for truncated in (True, False):
        with pytest.raises(ValueError, match="not a finite number"):
            completion_scores(environment, example, "anything at all", truncated)
