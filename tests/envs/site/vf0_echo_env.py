"""A verifiers v0 environment written for the tests (importable as the top-level ``vf0_echo_env``).

``load_environment()`` returns a real ``SingleTurnEnv``: row i asks to reverse a word, with a
system prompt and a one-shot example; its ``Rubric`` has two reward functions, weighted 0.75
and 0.25, one reading the parsed answer, the other the row's ``info``.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

WORDS = ["abc", "dog", "cab", "bead", "faced", "gab", "hide", "deaf"]
SYSTEM_PROMPT = "Reverse the word."
FEW_SHOT = [{"role": "user", "content": "reverse: on"}, {"role": "assistant", "content": "no"}]


def rows(words: list[str]) -> Dataset:
    return Dataset.from_list(
        [{"question": f"reverse: {w}", "answer": w[::-1], "info": {"first": w[-1]}} for w in words]
    )


def exact(parser: Any, completion: Any, answer: str) -> float:
    return 1.0 if parser.parse_answer(completion) == answer else 0.0


async def starts_right(completion: Any, info: dict[str, str], **kwargs: Any) -> float:
    reply = kwargs["parser"].parse_answer(completion) or ""
    return 1.0 if reply[:1] == info["first"] else 0.0


def load_environment(count: int = 6, eval_count: int = 2) -> Any:
    parser = vf.Parser(extract_fn=str.strip)
    rubric = vf.Rubric(funcs=[exact, starts_right], weights=[0.75, 0.25], parser=parser)
    words = [WORDS[i % len(WORDS)] for i in range(count + eval_count)]
    return vf.SingleTurnEnv(
        dataset=rows(words[:count]),
        eval_dataset=rows(words[count:]) if eval_count else None,
        system_prompt=SYSTEM_PROMPT,
        few_shot=FEW_SHOT,
        parser=parser,
        rubric=rubric,
    )
