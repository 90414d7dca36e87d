"""The trainer's built-in tasks as the ledger's task source (`task_source = "coordinator.builtin_tasks:BuiltinTasks"`).

Prompt group ``g`` of a task with ``n`` prompts per group is examples ``g*n .. g*n+n-1`` of the
task's training stream, encoded with the built-in model's tokenizer (the start checkpoint's):
a pure function of (task, group), as the ledger requires. Runs whose policy uses another
tokenizer write their own source with the same two methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from coordinator.task_source import SourcePrompt
from trainer.tasks import get_task, task_names, task_prompt

TOKENIZER_MODEL = "builtin:tiny-qwen2"


class BuiltinTasks:
    def __init__(self, tokenizer_model: str = TOKENIZER_MODEL, seed: int = 0) -> None:
        self.tokenizer_model = tokenizer_model
        self.seed = seed

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        from trainer.builtin import resolve_model_path

        return AutoTokenizer.from_pretrained(str(resolve_model_path(self.tokenizer_model)))

    def has_task(self, task_name: str) -> bool:
        return task_name in task_names()

    def prompt_group(self, task_name: str, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        task = get_task(task_name, self.seed)
        first = group_index * num_prompts
        prompts = [task_prompt(task, first + k, self.tokenizer) for k in range(num_prompts)]
        return [SourcePrompt(tuple(prompt.token_ids), prompt.text, prompt.index) for prompt in prompts]
