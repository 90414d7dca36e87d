"""Environments: where every role gets prompts and rewards from, and the one config section that names them.

An environment turns an example ``index`` into a prompt (plain text or chat messages) plus
whatever its scorer needs, and scores a completion of that prompt into named, weighted rewards
(:class:`environments.base.Environment`). Everything is a pure function of (environment config,
index), so the coordinator (prompts), validators (rewards), the orchestrator and
``prime-trainer sft|eval|rl`` agree on an example from its index alone. The ``[environment]``
section of every role picks an adapter (:mod:`environments.config`): a built-in task, a
reasoning-gym dataset, a verifiers v1 taskset or v0 environment, or an operator's own Python class;
:func:`environments.loader.load_environment` builds it and refuses, with one line, what the
process cannot serve or score. Heavy ecosystem packages are imported only when that adapter is
loaded.
"""

from environments.base import EVAL_STREAM_OFFSET, ChatMessage, Environment, Example, Scores
from environments.config import (
    BuiltinEnvConfig,
    EnvironmentConfig,
    PythonEnvConfig,
    ReasoningGymEnvConfig,
    VerifiersEnvConfig,
)

__all__ = [
    "EVAL_STREAM_OFFSET",
    "BuiltinEnvConfig",
    "ChatMessage",
    "Environment",
    "EnvironmentConfig",
    "Example",
    "PythonEnvConfig",
    "ReasoningGymEnvConfig",
    "Scores",
    "VerifiersEnvConfig",
]
