"""The ``python`` adapter: an operator's own environment, named ``module:attribute``.

The attribute is an :class:`environments.base.Environment` subclass or any factory returning an
object with its ``example`` and ``score`` methods; it is called with the section's ``args`` as
keyword arguments. The module must be importable by every role (installed, or on PYTHONPATH).
The environment owns its eval split (``eval_example``); one whose first eval prompts are among its
first training prompts is refused (:func:`environments.held_out.check_held_out`).
"""

from __future__ import annotations

import importlib
from typing import Any

from environments.base import Environment
from environments.config import PythonEnvConfig
from environments.held_out import check_held_out
from protocol.errors import ConfigError


def load_python_environment(config: PythonEnvConfig) -> Environment:
    module_name, _, attribute = config.target.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"environment target {config.target!r} cannot be loaded ({exc}): install its module or fix the name"
        ) from exc
    environment = found(**config.args) if callable(found) else found
    if not isinstance(environment, Environment):
        raise ConfigError(
            f"environment target {config.target!r} gave a {type(environment).__name__}, "
            "not an environments.base.Environment: subclass it"
        )
    try:
        check_held_out(environment)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ConfigError(f"environment target {config.target!r} cannot draw its examples: {exc}") from exc
    return environment
