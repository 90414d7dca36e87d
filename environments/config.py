"""The ``[environment]`` config section every role reads: one adapter, picked by ``type``.

``type = "builtin"`` (this project's tasks), ``"reasoning_gym"`` (a reasoning-gym dataset and its
arguments), ``"verifiers"`` (an installed verifiers v1 taskset or v0 environment) or ``"python"`` (an operator's own
:class:`environments.base.Environment`, as ``module:attribute``). The resolved section is what
:func:`environments.loader.environment_identity` hashes into the run spec, so two processes with equal sections
(and equal package versions) serve and score the same examples.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from environments.base import TruncatedRule
from protocol.schemas import MAX_EPISODE_TURNS
from runtime.config import Section

MODULE_ATTRIBUTE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"


class EpisodeLimits(Section):
    """Bounds on one multi-turn episode, signed into the run spec with the rest of the section (a single-turn
    environment has one policy turn whatever they say)."""

    max_turns: int = Field(default=4, ge=1, le=MAX_EPISODE_TURNS)
    """Policy turns per episode: the episode ends after this many, whatever the environment would reply."""
    max_reply_chars: int = Field(default=2000, ge=1, le=1_000_000)
    """Characters of one environment reply (all its messages); a longer reply fails the episode."""
    reply_time_s: float = Field(default=1.0, gt=0, le=60)
    """Seconds one environment reply may take; a slower one fails the episode (the environment's fault)."""


class EnvironmentSection(Section):
    """What every adapter's section has: the truncation rule and the episode limits."""

    truncated: TruncatedRule = "minimum"
    """A completion cut at max_tokens without EOS: ``minimum`` earns no credit (penalties kept), ``score`` is
    scored like any other."""
    episode: EpisodeLimits = Field(default_factory=EpisodeLimits)
    """Bounds on a multi-turn environment's episodes."""


class BuiltinEnvConfig(EnvironmentSection):
    """A built-in environment of this project."""

    type: Literal["builtin"] = "builtin"
    """The adapter: one of this project's built-in environments."""
    name: Literal["reverse_text", "arithmetic", "sort_digits", "calculator", "count_shapes"] = "reverse_text"
    """Which built-in environment (``calculator`` is multi-turn: its ``[environment.episode]`` limits apply;
    ``count_shapes`` shows an image with each prompt and needs a vision-language policy)."""
    seed: int = Field(default=0, ge=0, lt=2**63)
    """Seed of its example generator."""


class ReasoningGymEnvConfig(EnvironmentSection):
    """A reasoning-gym dataset (``pip install prime-network[envs]``); rewards are the dataset's ``score_answer``."""

    type: Literal["reasoning_gym"] = "reasoning_gym"
    """The adapter: a reasoning-gym dataset."""
    dataset: str = Field(pattern=r"^[a-z0-9_]+(/[a-z0-9_]+)?$", max_length=64)
    """A reasoning-gym dataset name, e.g. ``spell_backward`` (see ``reasoning_gym.factory.DATASETS``)."""
    size: int = Field(default=100_000, ge=1, le=10_000_000)
    """Rows in the training split; index ``i`` is row ``i % size`` (the next training-side row when row ``i`` is
    held out)."""
    seed: int = Field(default=0, ge=0, lt=2**31)
    """Seed of the training split (rows seeded ``seed`` to ``seed + size - 1``); the eval split's rows are seeded
    from ``seed + size`` on."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """The dataset's own config arguments (difficulty parameters, e.g. ``max_word_len = 5``)."""
    system_prompt: str | None = Field(default=None, max_length=4096)
    """System message for chat-templated policies (none: the user message only)."""


class VerifiersEnvConfig(EnvironmentSection):
    """An installed verifiers environment (``pip install prime-network[envs]`` plus the environment's package).

    ``api = "v1"``: a v1 ``Taskset``; ``api = "v0"``: a v0 environment whose ``load_environment()``
    returns a ``SingleTurnEnv`` scored by its ``Rubric``.
    """

    type: Literal["verifiers"] = "verifiers"
    """The adapter: an installed verifiers taskset or environment."""
    api: Literal["v1", "v0"] = "v1"
    """Which verifiers API the package is written against: ``v1`` (a ``Taskset``) or ``v0`` (``load_environment()``)."""
    taskset: str = Field(pattern=r"^[A-Za-z0-9_.\-/@]+$", max_length=128)
    """The taskset id (v1) or environment id (v0), as ``vf-eval`` takes it: an installed package exporting
    one ``Taskset`` via ``__all__`` (v1), or a module with a ``load_environment`` function (v0)."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """The taskset's config fields (v1, ``--env.taskset.*``) or ``load_environment``'s keyword arguments (v0)."""
    limit: int = Field(default=100_000, ge=1, le=10_000_000)
    """Tasks (v1) or dataset rows (v0) read (an infinite taskset is cut here); index ``i`` is task ``i % n``."""
    eval_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    """The last this fraction of those tasks is the eval split, never trained on (v0: unless the
    environment has an ``eval_dataset``, which is then the eval split); eval tasks whose prompt a training task
    asks are dropped, and a split left empty is refused."""


class PythonEnvConfig(EnvironmentSection):
    """An operator's own environment class or factory."""

    type: Literal["python"] = "python"
    """The adapter: an operator's own class or factory."""
    target: str = Field(pattern=MODULE_ATTRIBUTE, max_length=256)
    """``module:attribute``: an Environment subclass or factory, called with ``args`` as keyword arguments."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """Keyword arguments of the factory."""


EnvironmentConfig = Annotated[
    BuiltinEnvConfig | ReasoningGymEnvConfig | VerifiersEnvConfig | PythonEnvConfig, Field(discriminator="type")
]
"""The ``[environment]`` section: one adapter, discriminated by ``type``."""
