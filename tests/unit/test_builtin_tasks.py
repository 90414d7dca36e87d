"""The built-in task source: deterministic groups of real task prompts in the built-in tokenizer."""

from __future__ import annotations

from coordinator.builtin_tasks import BuiltinTasks
from coordinator.task_source import TaskSource, load_task_source
from trainer.tasks import get_task


def test_groups_are_deterministic_task_prompts() -> None:
    source = load_task_source("coordinator.builtin_tasks:BuiltinTasks")
    assert isinstance(source, TaskSource) and isinstance(source, BuiltinTasks)
    assert source.has_task("reverse_text") and source.has_task("arithmetic") and not source.has_task("chess")
    group = source.prompt_group("reverse_text", 3, 4)
    again = BuiltinTasks().prompt_group("reverse_text", 3, 4)
    assert group == again and len(group) == 4
    task = get_task("reverse_text")
    assert [p.text for p in group] == [task.example(12 + k).prompt for k in range(4)]
    assert all(p.token_ids and source.tokenizer.decode(list(p.token_ids)) == p.text for p in group)
    assert source.prompt_group("reverse_text", 4, 4) != group
