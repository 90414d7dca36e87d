"""Prompts as the policy sees them: chat-templated when its tokenizer has a template, else plain text.

With a chat template, the example's messages (a plain-text prompt is one user message; the
environment's system prompt goes first) are rendered with the template and its generation
prompt. Without one (the built-in tiny model), a plain-text prompt is sent as is and chat
messages are their contents joined by newlines, ending in a newline. Token ids are the rendered
text encoded without adding special tokens (the template already wrote the ones it wants).
"""

from __future__ import annotations

from typing import Any

from environments.base import ChatMessage, Environment, Example


def chat_messages(example: Example, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The example's prompt as chat messages (``{"role", "content"}``), the system prompt first."""
    messages = [ChatMessage("user", example.prompt)] if isinstance(example.prompt, str) else list(example.prompt)
    if system_prompt and not any(m.role == "system" for m in messages):
        messages.insert(0, ChatMessage("system", system_prompt))
    return [{"role": m.role, "content": m.content} for m in messages]


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_text(environment: Environment, example: Example, tokenizer: Any) -> str:
    """The text of ``example``'s prompt for a policy with ``tokenizer``."""
    if has_chat_template(tokenizer):
        rendered = tokenizer.apply_chat_template(
            chat_messages(example, environment.system_prompt), tokenize=False, add_generation_prompt=True
        )
        return str(rendered)
    if isinstance(example.prompt, str):
        return example.prompt
    return "\n".join(m["content"] for m in chat_messages(example, environment.system_prompt)) + "\n"


def prompt_ids(environment: Environment, example: Example, tokenizer: Any) -> list[int]:
    """:func:`prompt_text` encoded with ``tokenizer`` (no special tokens added)."""
    return list(tokenizer.encode(prompt_text(environment, example, tokenizer), add_special_tokens=False))
