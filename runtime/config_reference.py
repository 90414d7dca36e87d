"""The configuration reference, docs/config-reference.md, generated from the role config models.

``python -m runtime.config_reference > docs/config-reference.md`` (or ``make config-reference``)
writes, for every role, each TOML table of its config (:func:`runtime.config.config_tables`,
members of the ``[environment]`` union included) with every key's type, default and docstring.
A unit test regenerates the page and fails when the committed one is stale. The roles are named
by ``module:class`` strings and imported when the page is made: ``protocol`` sits below them.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from runtime.config import ConfigTable, RoleConfig, config_tables, field_tables, toml_value

COMMAND = "python -m runtime.config_reference > docs/config-reference.md"
"""How the page is regenerated (also `make config-reference`)."""


@dataclass(frozen=True)
class Role:
    """One config root of the reference: its heading, the commands that read it, its example file."""

    title: str
    config: str
    """``module:class`` of the root."""
    commands: str
    example: str


ROLES = (
    Role(
        "Coordinator",
        "coordinator.config:CoordinatorConfig",
        "`prime-coordinator start` (and `publish`, `export`, `archive`, `slurm`)",
        "`configs/coordinator.toml`, `configs/demo.toml`",
    ),
    Role("Worker", "worker.config:WorkerConfig", "`prime-worker join` (and `slurm`)", "`configs/worker.toml`"),
    Role("Validator", "validator.config:ValidatorConfig", "`prime-validator run`", "`configs/validator.toml`"),
    Role("Relay", "shardcast.relay.config:RelayConfig", "`prime-relay serve`", "`configs/relay.toml`"),
    Role("Trainer: SFT", "trainer.config:SftConfig", "`prime-trainer sft`", "`configs/sft.toml`"),
    Role("Trainer: local RL", "trainer.config:RlConfig", "`prime-trainer rl`", "`configs/rl.toml`"),
    Role("Trainer: eval", "trainer.config:EvalConfig", "`prime-trainer eval`", "`configs/eval.toml`"),
)


def role_config(role: Role) -> type[RoleConfig]:
    module, name = role.config.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and issubclass(cls, RoleConfig), f"{role.config} is not a RoleConfig"
    return cls


def _home_relative(text: str) -> str:
    """A path under the home directory written from ``~`` (the page must not depend on who makes it)."""
    home = str(Path.home())
    return "~" + text[len(home) :] if text == home or text.startswith(home + "/") else text


def _bounds(metadata: list[Any]) -> list[str]:
    found = []
    for item in metadata:
        for attribute, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attribute, None)
            if isinstance(item, annotated_types.BaseMetadata) and value is not None:
                found.append(f"{symbol} {value}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            found.append(f"at least {item.min_length} long")
        if isinstance(item, annotated_types.MaxLen):
            found.append(f"at most {item.max_length} long")
    return found


def type_name(annotation: Any) -> str:
    """A short, readable form of a field's type: ``int``, ``list of str``, ``"mask" or "clip"``."""
    if get_origin(annotation) is Annotated:
        inner, *metadata = get_args(annotation)
        bounds = _bounds(metadata)
        return type_name(inner) + (f" ({', '.join(bounds)})" if bounds else "")
    if annotation is type(None):
        return "unset"
    if get_origin(annotation) in (Union, types.UnionType):
        members = [type_name(arg) for arg in get_args(annotation)]
        return " or ".join(dict.fromkeys(members))
    if get_origin(annotation) is Literal:
        return " or ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in get_args(annotation))
    if get_origin(annotation) in (list, set, frozenset):
        return f"list of {type_name(get_args(annotation)[0])}"
    if get_origin(annotation) is tuple:
        return "[" + ", ".join(type_name(arg) for arg in get_args(annotation)) + "]"
    if get_origin(annotation) is dict:
        return f"table of {type_name(get_args(annotation)[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    if annotation is Path:
        return "path"
    if getattr(annotation, "__name__", None) == "JsonValue":
        return "any TOML value"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def field_type(field: FieldInfo) -> str:
    name = type_name(field.annotation)
    bounds = _bounds(field.metadata)
    pattern = next((item.pattern for item in field.metadata if hasattr(item, "pattern") and item.pattern), None)
    details = bounds + ([f"matching `{pattern}`"] if pattern else [])
    return name + (f" ({', '.join(details)})" if details else "")


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return "unset" if value is None else f"`{toml_value(_jsonable(value))}`"


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return _home_relative(str(value))
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return value


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _heading(table: ConfigTable) -> str:
    if not table.key:
        return "Top-level keys"
    name = f"`[[{table.key[:-2]}]]`" if table.key.endswith("[]") else f"`[{table.key}]`"
    return name + (f" with `{table.variant}`" if table.variant else "")


def _rows(table: ConfigTable) -> list[str]:
    rows = []
    for name, field in table.model.model_fields.items():
        key = f"{table.key}.{name}" if table.key else name
        if any(inner.key == key for inner in field_tables(key, field)):
            continue  # a table of its own, below
        description = _cell(field.description or "")
        rows.append(f"| `{key}` | {_cell(field_type(field))} | {_cell(default_text(field))} | {description} |")
    return rows


def _describe(table: ConfigTable) -> str:
    return " ".join(((table.field and table.field.description) or "").split())


def role_section(role: Role) -> list[str]:
    root = role_config(role)
    prefix = root.model_config.get("env_prefix", "")
    lines = [
        f"## {role.title}",
        "",
        f"Read by {role.commands}; environment prefix `{prefix}`; example: {role.example}.",
    ]
    tables = config_tables(root)
    for table in tables:
        if table.variant:
            members = [other for other in tables if other.key == table.key]
            if members[0] is table:  # the union's own heading, once, before its members
                tags = ", ".join(f"`{member.variant}`" for member in members)
                optional = " It may be left out altogether." if table.optional else ""
                lines += ["", f"### `[{table.key}]`", "", f"{_describe(table)} One table, picked by: {tags}.{optional}"]
            lines += ["", f"#### {_heading(table)}"]
        else:
            lines += ["", f"### {_heading(table)}"]
            intro = _describe(table) + (" The table may be left out altogether." if table.optional else "")
            if intro.strip():
                lines += ["", intro.strip()]
        rows = _rows(table)
        if rows:
            lines += ["", "| key | type | default | what |", "|---|---|---|---|", *rows]
    return [*lines, ""]


def reference() -> str:
    """The whole page."""
    lines = [
        "# Configuration reference",
        "",
        "Every key of every role's config: its TOML table, type, default and meaning. How files,",
        "environment variables and flags combine, and `config show`, are in [configuration](configuration.md).",
        f"This page is generated from the config models: `{COMMAND}` (or `make config-reference`)",
        "rewrites it, and a unit test fails when it is stale. A key `a.b.c` is `c` in the table `[a.b]`.",
        "",
    ]
    for role in ROLES:
        lines += role_section(role)
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def main() -> None:
    sys.stdout.write(reference())


if __name__ == "__main__":
    main()
