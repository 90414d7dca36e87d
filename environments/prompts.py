"""The ledger's prompts: groups of an environment's examples, rendered and tokenized for the policy.

Prompt group ``g`` with ``n`` prompts per group is training examples ``g*n .. g*n+n-1`` of the
environment, rendered with the policy's tokenizer (:mod:`environments.render`): a pure function
of (environment config, tokenizer, group), so a ledger that restarts and asks again for a group
gets the same prompts. :class:`PromptSource` is the small shape the ledger depends on;
:class:`EnvironmentPrompts` is what the coordinator gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from environments.base import Environment
from environments.episode import episode_turns
from environments.images import image_hashes
from environments.render import ImageBlocks, encode_prompt, prompt_text


@dataclass(frozen=True)
class SourcePrompt:
    token_ids: tuple[int, ...]
    """The prompt as the policy's tokenizer encodes it (authoritative)."""
    text: str
    """The same prompt for people (dashboards, logs)."""
    example_index: int | None = None
    """The example's index in the environment (validators recompute rewards from it)."""
    image_sha256: tuple[str, ...] = ()
    """The hashes of the example's images (:mod:`environments.images`): every party renders them from the index
    and checks them against these; nobody's pixels are taken on trust."""


class PromptSource(Protocol):
    name: str
    """The environment's name, recorded as each task's ``task_name``."""
    max_turns: int
    """Policy turns a rollout may have: 1 for a single-turn environment (:func:`environments.episode.episode_turns`)."""
    shows_images: bool
    """The prompts show images (their examples carry them; the environment's first example decides)."""

    def prompt_group(self, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        """The prompts of group ``group_index``; the same arguments always give the same prompts."""
        ...


def shows_images(environment: Environment) -> bool:
    """Whether ``environment``'s prompts show images: its examples carry them (its first example decides)."""
    return bool(environment.example(0).images)


class EnvironmentPrompts:
    """:class:`PromptSource` over an environment and the policy's tokenizer (and, for a vision-language policy, how
    it writes an image in a prompt)."""

    def __init__(self, environment: Environment, tokenizer: Any, images: ImageBlocks | None = None) -> None:
        self.environment = environment
        self.tokenizer = tokenizer
        self.images = images
        self.name = environment.name[:64]
        self.max_turns = episode_turns(environment)
        self.shows_images = shows_images(environment)

    def prompt_group(self, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        first = group_index * num_prompts
        prompts = []
        for index in range(first, first + num_prompts):
            example = self.environment.example(index)
            text = prompt_text(self.environment, example, self.tokenizer, self.images)
            token_ids = tuple(encode_prompt(text, self.tokenizer))
            prompts.append(SourcePrompt(token_ids, text, index, image_hashes(example.images)))
        return prompts


class NoPrompts:
    """A source with no prompts, for ledger tools that never lease (``prime-coordinator publish``)."""

    name = "none"
    max_turns = 1
    shows_images = False

    def prompt_group(self, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        return ()
