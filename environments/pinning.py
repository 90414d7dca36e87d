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
from environments.images import Image
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


class ImageMismatch(ValueError):  # noqa: N818 - names what differs, as EpisodeError does
    """A task prompt's images, rendered here, are not the ones the ledger pinned (this node's environment differs
    from the run's), or a prompt that pins images names no example."""


def prompt_images(environment: Environment, example_index: int | None, pinned_sha256: list[str]) -> tuple[Image, ...]:
    """The images of a task prompt, rendered here from ``example_index`` and checked against ``pinned_sha256``
    (a prompt that pins none has none); :class:`ImageMismatch` naming the first difference otherwise."""
    if not pinned_sha256:
        return ()
    if example_index is None:
        raise ImageMismatch("the prompt pins images but names no example to render them from")
    images = environment.example(example_index).images
    rendered = [image.sha256 for image in images]
    if rendered != pinned_sha256:
        raise ImageMismatch(
            f"example {example_index} renders {len(rendered)} image(s) here that are not the {len(pinned_sha256)} "
            f"the run pinned (first here {rendered[0][:12] if rendered else 'none'}, pinned {pinned_sha256[0][:12]}); "
            "this node's environment differs from the run's"
        )
    return images
