"""A verifiers v0 multi-turn environment written for the tests (importable as the top-level ``vf0_guess_env``).

``load_environment()`` returns a real ``MultiTurnEnv``: row i hides a number from 1 to 9; each policy turn is a
guess, and ``env_response`` answers ``higher`` or ``lower`` as a user message, counting the guesses in the
rollout state; a correct guess ends the game with a final ``correct`` (``state["final_env_response"]``), as
does ``max_turns`` guesses. Its ``Rubric`` rewards a correct last guess (weight 1), fewer guesses (weight 0.5)
and hearing ``correct`` at the end (weight 0.25).
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def rows(count: int, offset: int = 0) -> Dataset:
    return Dataset.from_list(
        [
            {"question": f"Guess my number from 1 to 9 (game {offset + i}).", "answer": str(1 + (offset + i * 4) % 9)}
            for i in range(count)
        ]
    )


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", "")
    return str(content or "").strip()


class GuessEnv(vf.MultiTurnEnv):
    async def setup_state(self, state: Any) -> Any:
        state["guesses"] = 0
        return state

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        state["guesses"] += 1
        guess = _text(messages[-1])[:1]
        answer = state["answer"]
        if guess == answer:
            state["final_env_response"] = [vf.UserMessage(content="correct")]
            return state["final_env_response"]
        hint = "higher" if guess.isdigit() and guess < answer else "lower"
        return [vf.UserMessage(content=hint)]


def correct(completion: Any, answer: str) -> float:
    guesses = [_text(m) for m in completion if (m.get("role") if isinstance(m, dict) else m.role) == "assistant"]
    return 1.0 if guesses and guesses[-1][:1] == answer else 0.0


def few_guesses(completion: Any) -> float:
    count = sum(1 for m in completion if (m.get("role") if isinstance(m, dict) else m.role) == "assistant")
    return 1.0 / max(1, count)


def told_correct(completion: Any) -> float:
    return 1.0 if completion and _text(completion[-1]) == "correct" else 0.0


def load_environment(count: int = 12, eval_count: int = 4, max_turns: int = 3) -> Any:
    rubric = vf.Rubric(funcs=[correct, few_guesses, told_correct], weights=[1.0, 0.5, 0.25])
    return GuessEnv(
        dataset=rows(count),
        eval_dataset=rows(eval_count, offset=count) if eval_count else None,
        system_prompt="Answer with one digit.",
        rubric=rubric,
        max_turns=max_turns,
    )
