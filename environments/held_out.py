"""Held-out eval splits: which side of the train/eval partition a prompt's content falls on, and the checks.

An eval example must be one that no training index can produce. Where an adapter generates
examples (the built-in tasks, reasoning-gym), the partition is made on content: a prompt is held
out when the SHA-256 of its text (:func:`prompt_key`) falls in the first :data:`HELD_OUT_PERCENT`
of the hash range (:func:`is_held_out`); training draws only prompts on the training side and the
eval set only prompts on the held-out side, so the two sets are disjoint by construction, for every
seed and every index. The hash does not depend on the seed, so no run's training ever sees another
run's eval prompts. Where an adapter reads a fixed list (verifiers), the split is fixed and
:func:`held_out_items` drops any eval item whose prompt equals a training prompt. For an operator's
own environment (``python``), :func:`check_held_out` refuses one whose first eval prompts appear
among its first training prompts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from protocol.errors import ConfigError

HELD_OUT_PERCENT = 10
"""Percent of the prompt hash range that is held out for eval."""
MAX_DRAWS = 10_000
"""Draws a generator may take to find one example on its side before it is refused (a tiny content space)."""
CHECK_TRAIN_EXAMPLES = 4096
"""Training examples an operator's environment is checked against at start-up."""
CHECK_EVAL_EXAMPLES = 64
"""Eval examples an operator's environment is checked with at start-up."""

Item = TypeVar("Item")


class Message(Protocol):
    """What is read of a chat message (environments.base.ChatMessage): this module sits below that one."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


class Examples(Protocol):
    """What is read of an environment (environments.base.Environment) to check its split."""

    @property
    def name(self) -> str: ...

    def example(self, index: int) -> Any: ...

    def eval_example(self, number: int) -> Any: ...


def prompt_key(prompt: str | tuple[Message, ...], image_hashes: Sequence[str] = ()) -> str:
    """The content a prompt is compared and partitioned by: its text, or its messages' roles and contents, and the
    hashes of its images (a prompt without images keys as its text alone)."""
    text = prompt if isinstance(prompt, str) else "\n".join(f"{message.role}: {message.content}" for message in prompt)
    return text + "".join(f"\nimage: {digest}" for digest in image_hashes)


def is_held_out(prompt: str | tuple[Message, ...], image_hashes: Sequence[str] = ()) -> bool:
    """Whether ``prompt`` (with images of ``image_hashes``) is on the eval side of the content partition (about
    :data:`HELD_OUT_PERCENT` percent)."""
    digest = hashlib.sha256(prompt_key(prompt, image_hashes).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT


def held_out_items(
    train: Sequence[Item], held_out: Sequence[Item], key: Callable[[Item], str]
) -> tuple[list[Item], list[Item]]:
    """(train, eval) of a fixed split: eval items whose ``key`` equals a training item's are dropped."""
    seen = {key(item) for item in train}
    return list(train), [item for item in held_out if key(item) not in seen]


def check_held_out(
    environment: Examples,
    num_train: int = CHECK_TRAIN_EXAMPLES,
    num_eval: int = CHECK_EVAL_EXAMPLES,
) -> None:
    """ConfigError when one of the first ``num_eval`` eval prompts is one of the first ``num_train`` training ones."""
    train = {example_key(environment.example(i)): i for i in range(num_train)}
    for number in range(num_eval):
        key = example_key(environment.eval_example(number))
        if key in train:
            raise ConfigError(
                f"environment {environment.name!r}: eval example {number} is training example {train[key]} "
                f"({key[:60]!r}); its eval_example must draw examples its example() never produces"
            )


def example_key(example: Any) -> str:
    """The key of an example (environments.base.Example): its prompt and its images' hashes."""
    return prompt_key(example.prompt, [image.sha256 for image in getattr(example, "images", ())])
