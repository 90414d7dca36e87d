"""A node's side of environment pinning: load the run's environment, or say exactly why it cannot.

:func:`run_environment` takes the run spec the coordinator signed and the node's own
``[environment]`` section (``None``: take the run's). It loads that environment, checks that its
rewards are deterministic, and compares its identity with the run's: a different kind, name,
argument, package or version is refused with one line saying what to set or install. A
validator that gets an environment from here never posts a verdict without recomputed rewards.
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from environments.base import Environment
from environments.config import EnvironmentConfig
from environments.loader import environment_identity, identity_mismatch, load_checked_environment
from protocol.errors import ConfigError
from protocol.schemas import RunSpec


def spec_environment_config(spec: RunSpec) -> EnvironmentConfig:
    """The ``[environment]`` section the run spec names (what a node without its own section loads)."""
    try:
        return TypeAdapter(EnvironmentConfig).validate_python(dict(spec.environment.arguments))
    except ValidationError as exc:
        raise ConfigError(
            f"the run's environment ({spec.environment.kind} {spec.environment.name!r}) is not one this version "
            f"of prime-network understands: {exc.errors()[0]['msg']}; upgrade prime-network"
        ) from exc


def run_environment(spec: RunSpec, own: EnvironmentConfig | None) -> Environment:
    """The run's environment, loaded here and checked against ``spec``; ConfigError (one line) otherwise."""
    config = own if own is not None else spec_environment_config(spec)
    expected = spec.environment
    try:
        environment = load_checked_environment(config)
    except ConfigError as exc:
        raise ConfigError(
            f"cannot load the run's environment {expected.kind} {expected.name!r} "
            f"({expected.package} {expected.package_version}): {exc.message}"
        ) from exc
    mismatch = identity_mismatch(expected, environment_identity(config))
    if mismatch is not None:
        raise ConfigError(mismatch)
    return environment
