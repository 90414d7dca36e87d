"""The ``reasoning_gym`` adapter: any reasoning-gym dataset, scored by the dataset's own ``score_answer``.

reasoning-gym datasets are procedural: row ``i`` of ``create_dataset(name, size, seed, **args)`` is
a pure function of (name, args, seed, i), offline. Training example ``index`` is row
``index % size`` of the split seeded ``seed``; eval example ``n`` is row ``n % size`` of the split
seeded ``seed + 1``. The prompt is the row's question as a user message (after the configured
system prompt); the single reward ``score_answer`` is the dataset's score of the stripped
completion against the row.
"""

from __future__ import annotations

from typing import Any

from environments.base import ChatMessage, Environment, Example, Scores
from environments.config import ReasoningGymEnvConfig

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
            config.dataset, size=config.size, seed=config.seed + 1, **config.args
        )

    def _example(self, index: int, row: dict[str, Any]) -> Example:
        messages = [ChatMessage("user", str(row["question"]))]
        if self.system_prompt:
            messages.insert(0, ChatMessage("system", self.system_prompt))
        return Example(index=index, prompt=tuple(messages), answer=str(row["answer"]), data=row)

    def example(self, index: int) -> Example:
        return self._example(index, self._train[index % self.config.size])

    def eval_example(self, number: int) -> Example:
        return self._example(-1 - number, self._eval[number % self.config.size])

    def score(self, example: Example, completion: str) -> Scores:
        dataset = self._eval if example.index < 0 else self._train
        return Scores.single(REWARD_NAME, float(dataset.score_answer(answer=completion.strip(), entry=example.data)))
