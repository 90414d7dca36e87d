"""Loading role configs: TOML file < environment variables < command-line flags.

Each role declares a :class:`RoleConfig` subclass (pydantic-settings, ``extra="forbid"``,
one docstring per field). :func:`load_config` reads an optional TOML file, applies
``PRIME_<ROLE>_*`` environment variables (nested keys joined by ``__``) and then explicit
overrides from flags (dotted keys such as ``api.port``), validates everything once at
start-up, and turns any problem into a :class:`ConfigError` that names the key and the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from protocol.errors import ConfigError

_toml_file: ContextVar[Path | None] = ContextVar("_toml_file", default=None)


class Section(BaseModel):
    """A nested config table: strict like the root."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class RoleConfig(BaseSettings):
    """Root of a role's config. Subclasses set ``env_prefix`` (e.g. ``PRIME_WORKER_``)."""

    model_config = SettingsConfigDict(extra="forbid", env_nested_delimiter="__", validate_default=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _toml_file.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


ConfigT = TypeVar("ConfigT", bound=RoleConfig)


@contextmanager
def _reading(path: Path | None) -> Iterator[None]:
    token = _toml_file.set(path)
    try:
        yield
    finally:
        _toml_file.reset(token)


def dotted_to_nested(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"api.port": 1}`` -> ``{"api": {"port": 1}}``; None values (flags not given) are dropped."""
    nested: dict[str, Any] = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        table = nested
        for key in parents:
            table = table.setdefault(key, {})
        table[leaf] = value
    return nested


def parse_assignment(assignment: str) -> tuple[str, Any]:
    """``key.sub=value`` from a ``--set`` flag; the value is read as TOML, else kept as a string."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects KEY=VALUE (e.g. api.port=8000), got {assignment!r}")
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        value = text
    return key.strip(), value


def _describe(error: Mapping[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "<root>"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}' (not a setting of this config; check the spelling)"
    return f"key '{key}': {error['msg']} (got {error.get('input')!r})"


def load_config(cls: type[ConfigT], path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> ConfigT:
    """Read, merge and validate a role config; ConfigError names each bad key and the file."""
    source = str(path) if path is not None else "defaults"
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    with _reading(path):
        try:
            return cls(**dotted_to_nested(overrides or {}))
        except ValidationError as exc:
            problems = "; ".join(_describe(err) for err in exc.errors())
            origin = f"{source} (with {cls.model_config.get('env_prefix', '')}* environment and flags applied)"
            raise ConfigError(f"invalid config in {origin}: {problems}") from exc
