"""The ``reasoning_gym`` adapter: any reasoning-gym dataset, scored by the dataset's own ``score_answer``.

reasoning-gym datasets are procedural: row ``i`` of ``create_dataset(name, size, seed, **args)`` is
a pure function of (name, args, ``seed + i``), offline. The eval split is held out twice over:
its rows come from a disjoint seed range (the training split's rows are seeded ``seed`` to
``seed + size - 1``, the eval split's from ``seed + size`` on) and the two are partitioned by
content (:mod:`environments.held_out`): training example ``index`` is row ``index % size`` of the
training split, or when that row's question is held out, the next row whose question is not; eval
example ``n`` is the ``n``-th row of the eval split whose question is held out. Different seeds can
ask the same question, and the partition makes sure no training row ever asks an eval question.
The prompt is the row's question as a user message (after the configured system prompt); the
single reward ``score_answer`` is the dataset's score of the answer read from the completion: as
many of its first non-empty lines as the row's reference answer has (:mod:`environments.answers`),
so text on later lines neither earns nor costs credit.
"""

from __future__ import annotations

from typing import Any

from environments.answers import answer_lines
from environments.base import ChatMessage, Environment, Example, Scores
from environments.config import ReasoningGymEnvConfig
from environments.held_out import is_held_out

REWARD_NAME = "score_answer"


class ReasoningGymEnvironment(Environment):
    default_max_tokens = 64

    def __init__(self, config: ReasoningGymEnvConfig) -> None:
        import reasoning_gym

        self.config = config
        self.name = config.dataset
        self.system_prompt = config.system_prompt
        self._train: Any = reasoning_gym.create_dataset(
            config.dataset, size=config.size, seed=config.seed, **config.args
        )
        self._eval: Any = reasoning_gym.create_dataset(
            config.dataset, size=config.size, seed=config.seed + config.size, **config.args
        )
        self._eval_rows: list[int] = []
        """The eval split's held-out rows found so far, in order (eval example ``n`` is row ``n`` of them, wrapping
        when the split has fewer)."""
        self._eval_scanned = 0

    def _example(self, index: int, row: dict[str, Any]) -> Example:
        messages = [ChatMessage("user", str(row["question"]))]
        if self.system_prompt:
            messages.insert(0, ChatMessage("system", self.system_prompt))
        return Example(index=index, prompt=tuple(messages), answer=str(row["answer"]), data=row)

    @staticmethod
    def _question_held_out(row: dict[str, Any]) -> bool:
        return is_held_out(str(row["question"]))

    def _train_row(self, position: int) -> dict[str, Any]:
        for step in range(self.config.size):
            row = self._train[(position + step) % self.config.size]
            if not self._question_held_out(row):
                return row  # type: ignore[no-any-return]
        raise ValueError(f"reasoning-gym dataset {self.name!r}: all {self.config.size} training rows are held out")

    def _eval_row(self, number: int) -> int:
        while len(self._eval_rows) <= number and self._eval_scanned < self.config.size:
            if self._question_held_out(self._eval[self._eval_scanned]):
                self._eval_rows.append(self._eval_scanned)
            self._eval_scanned += 1
        if not self._eval_rows:
            raise ValueError(
                f"reasoning-gym dataset {self.name!r}: none of its {self.config.size} eval rows is held out"
            )
        return self._eval_rows[number % len(self._eval_rows)]

    def example(self, index: int) -> Example:
        return self._example(index, self._train_row(index % self.config.size))

    def eval_example(self, number: int) -> Example:
        return self._example(-1 - number, self._eval[self._eval_row(number)])

    def score(self, example: Example, completion: str) -> Scores:
        dataset = self._eval if example.index < 0 else self._train
        answer = answer_lines(completion, str(example.data["answer"]).strip().count("\n") + 1)
        return Scores.single(REWARD_NAME, float(dataset.score_answer(answer=answer, entry=example.data)))
