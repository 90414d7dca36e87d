"""Loading role configs: TOML file < environment variables < command-line flags.

Each role declares a :class:`RoleConfig` subclass (pydantic-settings, ``extra="forbid"``,
one attribute docstring per field, which pydantic keeps as the field's description).
:func:`load_config` reads an optional TOML file, applies ``PRIME_<ROLE>_*`` environment
variables (nested keys joined by ``__``) and then explicit overrides from flags (dotted keys
such as ``api.port``), validates everything once at start-up, and turns any problem into a
:class:`ConfigError` that names the key and the file. :func:`config_tables` walks a root
through its nested sections (the config reference and its tests read it), and
:func:`config_to_toml` writes a resolved config back as TOML, passwords masked.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from protocol.errors import ConfigError

_toml_file: ContextVar[Path | None] = ContextVar("_toml_file", default=None)


class Section(BaseModel):
    """A nested config table: strict like the root."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


class RoleConfig(BaseSettings):
    """Root of a role's config. Subclasses set ``env_prefix`` (e.g. ``PRIME_WORKER_``)."""

    model_config = SettingsConfigDict(
        extra="forbid", env_nested_delimiter="__", validate_default=True, use_attribute_docstrings=True
    )

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


def dotted_to_nested(overrides: Mapping[str, Any], into: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"api.port": 1}`` -> ``{"api": {"port": 1}}``; None values (flags not given) are dropped. ``into``: set
    the keys in this nested dict (its other keys kept) and return it."""
    nested: dict[str, Any] = {} if into is None else into
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
    if error["type"] == "value_error" and isinstance(error.get("input"), Mapping):
        # a rule across a table's keys: its message names them, and echoing the whole table helps nobody
        return f"key '{key}': {error.get('ctx', {}).get('error', error['msg'])}"
    return f"key '{key}': {error['msg']} (got {error.get('input')!r})"


NOT_SETTINGS_ENV = frozenset({"PRIME_TRAINER_FAILPOINT"})
"""Variables under a role's prefix that are not settings (the trainer's crash-test failpoint)."""


def _configs_sharing_prefix(prefix: str) -> list[type[RoleConfig]]:
    """Every role config read from ``prefix``* variables (the trainer's commands share one prefix)."""
    found: list[type[RoleConfig]] = []
    pending: list[type[RoleConfig]] = [RoleConfig]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.model_config.get("env_prefix") == prefix:
            found.append(cls)
    return found


def unknown_environment_keys(cls: type[RoleConfig], environ: Mapping[str, str]) -> list[str]:
    """The ``PRIME_<ROLE>_*`` variables in ``environ`` that name no setting, each with a suggestion.

    pydantic-settings ignores a variable whose name matches no field, so a typo such as
    ``PRIME_WORKER_GPUS`` would silently leave the default in place. Nested keys (``API__PORTT``)
    are already refused by the sections' ``extra="forbid"``; this checks the top-level name.
    """
    prefix = str(cls.model_config.get("env_prefix", ""))
    if not prefix:
        return []
    known: set[str] = set()
    for config in _configs_sharing_prefix(prefix) or [cls]:
        known.update(name.lower() for name in config.model_fields)
    problems = []
    for variable in sorted(environ):
        if not variable.upper().startswith(prefix.upper()) or variable.upper() in NOT_SETTINGS_ENV:
            continue
        name = variable[len(prefix) :].lower().split("__", 1)[0]
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {prefix}{close[0].upper()}?" if close else ""
        problems.append(f"environment variable {variable} names no setting of this config{hint}")
    return problems


def load_config(cls: type[ConfigT], path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> ConfigT:
    """Read, merge and validate a role config; ConfigError names each bad key and the file."""
    source = str(path) if path is not None else "defaults"
    unknown = unknown_environment_keys(cls, os.environ)
    if unknown:
        raise ConfigError("; ".join(unknown) + " (unset it, or fix its spelling)")
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


@dataclass(frozen=True)
class ConfigTable:
    """One TOML table of a config: the root (key ``""``), a section, or one member of a union of sections."""

    key: str
    """Dotted key of the table (``orchestrator.trainer``); ``[]`` marks an array of tables, ``.<name>`` a map."""
    model: type[BaseModel]
    """The model whose fields are the table's keys."""
    variant: str | None = None
    """For one member of a discriminated union: its tag as TOML (``type = "builtin"``)."""
    optional: bool = False
    """The table may be left out altogether (the field's type allows None)."""
    field: FieldInfo | None = None
    """The field of the enclosing table that holds this one (None for the root)."""


def _unwrap(annotation: Any) -> tuple[Any, str | None]:
    """``annotation`` without ``Annotated`` layers, and the discriminator those layers name."""
    discriminator = None
    while get_origin(annotation) is Annotated:
        annotation, *metadata = get_args(annotation)
        for item in metadata:
            if isinstance(item, FieldInfo) and isinstance(item.discriminator, str):
                discriminator = item.discriminator
    return annotation, discriminator


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any, discriminator: str | None) -> tuple[list[Any], bool, str | None]:
    """The alternatives of a (possibly optional) union type, whether None is one, and the discriminator."""
    annotation, inner = _unwrap(annotation)
    discriminator = discriminator or inner
    if not _is_union(annotation):
        return [annotation], False, discriminator
    members: list[Any] = []
    optional = False
    for arg in get_args(annotation):
        if arg is type(None):
            optional = True
            continue
        more, more_optional, discriminator = _members(arg, discriminator)
        members += more
        optional = optional or more_optional
    return members, optional, discriminator


def _tag(model: type[BaseModel], discriminator: str) -> str | None:
    field = model.model_fields.get(discriminator)
    if field is None or get_origin(field.annotation) is not Literal:
        return None
    values = " or ".join(f'"{value}"' if isinstance(value, str) else str(value) for value in get_args(field.annotation))
    return f"{discriminator} = {values}"


def field_tables(key: str, field: FieldInfo) -> list[ConfigTable]:
    """The tables a field holds: one per model in its type (a union's members, list and dict elements)."""
    named = field.discriminator if isinstance(field.discriminator, str) else None
    members, optional, discriminator = _members(field.annotation, named)
    tables: list[ConfigTable] = []
    for member in members:
        origin = get_origin(member)
        if origin in (list, tuple, set, frozenset) and get_args(member):
            element, _ = _unwrap(get_args(member)[0])
            if _is_model(element):
                tables.append(ConfigTable(f"{key}[]", element, optional=True, field=field))
            continue
        if origin is dict and len(get_args(member)) == 2:
            element, _ = _unwrap(get_args(member)[1])
            if _is_model(element):
                tables.append(ConfigTable(f"{key}.<name>", element, optional=True, field=field))
            continue
        if _is_model(member):
            variant = _tag(member, discriminator) if discriminator and len(members) > 1 else None
            tables.append(ConfigTable(key, member, variant, optional, field))
    return tables


def config_tables(root: type[BaseModel]) -> list[ConfigTable]:
    """Every table of a config, the root first, each section before the sections inside it (depth first)."""
    found: list[ConfigTable] = []

    def visit(table: ConfigTable) -> None:
        found.append(table)
        for name, field in table.model.model_fields.items():
            key = f"{table.key}.{name}" if table.key else name
            for inner in field_tables(key, field):
                visit(inner)

    visit(ConfigTable("", root))
    return found


MASK = "***"
"""What a secret is shown as by :func:`config_to_toml`."""
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/:@\s]*:)(?P<password>[^@/\s]+)(?P<at>@)")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_\-]+$")


def mask_secrets(text: str) -> str:
    """``text`` with the password of any URL in it (``scheme://user:password@host``) replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda match: f"{match['head']}{MASK}{match['at']}", text)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(mask_secrets(value), ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = [f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items() if v is not None]
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"{type(value).__name__} has no TOML form")


def _table_lines(model: BaseModel, data: Mapping[str, Any], prefix: str) -> list[str]:
    lines: list[str] = []
    tables: list[tuple[str, BaseModel]] = []
    for name in type(model).model_fields:
        section = getattr(model, name)
        if isinstance(section, BaseModel):
            tables.append((name, section))
        elif data[name] is None:
            lines.append(f"# {_toml_key(name)} is unset")
        else:
            lines.append(f"{_toml_key(name)} = {toml_value(data[name])}")
    for name, section in tables:
        key = f"{prefix}{_toml_key(name)}"
        lines += ["", f"[{key}]", *_table_lines(section, data[name], f"{key}.")]
    return lines


def config_to_toml(config: BaseModel) -> str:
    """``config`` as TOML that :func:`load_config` reads back to the same config: sections as tables,
    unset (None) keys as comments, URL passwords and ``SecretStr`` fields masked."""
    lines = _table_lines(config, config.model_dump(mode="json"), "")
    return "\n".join(lines).lstrip("\n") + "\n"
