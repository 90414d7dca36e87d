"""The evaluator's report: exact-answer accuracy, stop and truncated fractions, length, rewards under the rule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from engines.base import GenerationRequest
from environments.config import EnvironmentConfig
from environments.loader import load_environment
from trainer.rollout import RolloutSampler

EOS = 0
MAX_TOKENS = 12


class CharTokenizer:
    """Token ``ord(c)`` per character, EOS id 0 (a special token); no chat template."""

    eos_token_id = EOS
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("" if i == EOS and skip_special_tokens else chr(i) for i in ids)


@dataclass
class Result:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class ScriptedEngine:
    """Answers eval example ``k`` exactly: even ``k`` then EOS, odd ``k`` then pads to max_tokens (a mock engine)."""

    answers: dict[str, str]

    def generate(self, requests: list[GenerationRequest]) -> list[Result]:
        results = []
        for k, request in enumerate(requests):
            ids = [ord(c) for c in self.answers[CharTokenizer().decode(request.prompt_ids)]]
            if k % 2 == 0:
                ids, reason = [*ids, EOS], "stop"
            else:
                ids, reason = (ids + [ord("\n")] + [ord("9")] * request.max_tokens)[: request.max_tokens], "length"
            results.append(Result(ids, [-0.1] * len(ids), reason))
        return results

    def load_weights(self, checkpoint_dir: Path) -> None: ...


@pytest.mark.parametrize(("rule", "reward_mean"), [("minimum", 0.5), ("score", 1.0)])
def test_eval_report_counts_truncation_and_values_it_by_the_rule(rule: str, reward_mean: float) -> None:
    section = {"type": "builtin", "name": "arithmetic", "truncated": rule}
    environment = load_environment(TypeAdapter(EnvironmentConfig).validate_python(section))
    examples = environment.eval_examples(8)
    engine = ScriptedEngine({str(ex.prompt): ex.answer or "" for ex in examples})
    sampler = RolloutSampler(engine, GenerationRequest, environment, CharTokenizer(), max_tokens=MAX_TOKENS)
    report = sampler.evaluate(8).as_dict()
    lengths = [len(ex.answer or "") + 1 for ex in examples[::2]] + [MAX_TOKENS] * 4
    assert report["stop_fraction"] == 0.5 and report["truncated_fraction"] == 0.5
    assert report["reward_mean"] == reward_mean and report["accuracy"] == reward_mean  # exact answers only
    assert report["mean_completion_tokens"] == pytest.approx(sum(lengths) / 8)
