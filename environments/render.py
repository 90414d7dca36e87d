"""Prompts as the policy sees them: chat-templated when its tokenizer has a template, else plain text.

With a chat template, the example's messages (a plain-text prompt is one user message; the
environment's system prompt goes first) are rendered with the template and its generation
prompt. Without one (the built-in tiny model), a plain-text prompt is sent as is and chat
messages are their contents joined by newlines, ending in a newline. Token ids are the rendered
text encoded without adding special tokens (the template already wrote the ones it wants). An
example's images are written, for a vision-language policy, as that policy's blocks of image tokens
before the text of the first user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from environments.base import ChatMessage, Environment, Example
from environments.images import Image


class ImageBlocks(Protocol):
    """What a vision-language policy writes in a prompt for each image (:class:`engines.vision.VisionInputs`)."""

    def image_block(self, image: Image) -> str:
        """The prompt text that holds ``image``'s place."""
        ...


def chat_messages(example: Example, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The example's prompt as chat messages (``{"role", "content"}``), the system prompt first."""
    messages = [ChatMessage("user", example.prompt)] if isinstance(example.prompt, str) else list(example.prompt)
    if system_prompt and not any(m.role == "system" for m in messages):
        messages.insert(0, ChatMessage("system", system_prompt))
    return [{"role": m.role, "content": m.content} for m in messages]


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_messages(messages: Sequence[ChatMessage], tokenizer: Any) -> str:
    """``messages`` as the policy sees them, ready for its reply: its chat template with the generation prompt, or
    without a template the contents each ended by a newline."""
    if has_chat_template(tokenizer):
        as_dicts = [{"role": m.role, "content": m.content} for m in messages]
        return str(tokenizer.apply_chat_template(as_dicts, tokenize=False, add_generation_prompt=True))
    return "".join(m.content + "\n" for m in messages)


def prompt_text(environment: Environment, example: Example, tokenizer: Any, images: ImageBlocks | None = None) -> str:
    """The text of ``example``'s prompt for a policy with ``tokenizer``. The example's images are written by
    ``images`` (a vision-language policy's blocks) before the text of the first user message; ValueError for an
    example with images and no ``images`` (a text-only policy would be shown the question without its picture)."""
    if example.images and images is None:
        raise ValueError(
            f"environment {environment.name!r} shows images with its prompts, and this policy reads text only; "
            "choose a text environment"
        )
    if isinstance(example.prompt, str) and not has_chat_template(tokenizer) and not example.images:
        return example.prompt
    messages = chat_messages(example, environment.system_prompt)
    if example.images and images is not None:
        first_user = next(i for i, message in enumerate(messages) if message["role"] == "user")
        blocks = "".join(images.image_block(image) for image in example.images)
        messages[first_user] = {"role": "user", "content": blocks + messages[first_user]["content"]}
    return render_messages([ChatMessage(m["role"], m["content"]) for m in messages], tokenizer)


def prompt_ids(
    environment: Environment, example: Example, tokenizer: Any, images: ImageBlocks | None = None
) -> list[int]:
    """:func:`prompt_text` encoded with ``tokenizer`` (:func:`encode_prompt`)."""
    return encode_prompt(prompt_text(environment, example, tokenizer, images), tokenizer)


def encode_prompt(text: str, tokenizer: Any) -> list[int]:
    """A rendered prompt's token ids: encoded without adding special tokens (the template wrote the ones it wants)."""
    return list(tokenizer.encode(text, add_special_tokens=False))
