"""Every setting of every role config has a default and a docstring, through every nested section.

The walk starts at each :class:`~runtime.config.RoleConfig` root and follows every field whose type
holds a config model: plain sections, the members of a discriminated union (``[environment]``),
optional sections and list or dict elements. A field's docstring is the string literal right after
it, which pydantic keeps as the field's description (``use_attribute_docstrings``); the config
reference and ``--help`` texts are made from it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field

from runtime.config import RoleConfig, Section, config_tables
from runtime.config_reference import ROLES, role_config

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGES = [
    pattern.rstrip("*")
    for pattern in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
]
ROOTS: list[type[RoleConfig]] = [role_config(role) for role in ROLES]
# Keys with no default on purpose: each names what its adapter loads, and the adapter exists only once the
# operator chose it (`type = ...`); a default would silently load something nobody asked for.
REQUIRED_BY_DESIGN = {
    ("ReasoningGymEnvConfig", "dataset"),
    ("VerifiersEnvConfig", "taskset"),
    ("PythonEnvConfig", "target"),
}


def models_of(root: type[BaseModel]) -> dict[type[BaseModel], str]:
    """Every model reachable from ``root``, with the first dotted key it is found at."""
    found: dict[type[BaseModel], str] = {}
    for table in config_tables(root):
        found.setdefault(table.model, f"{root.__name__}{'.' if table.key else ''}{table.key}")
    return found


def reachable() -> dict[type[BaseModel], str]:
    found: dict[type[BaseModel], str] = {}
    for root in ROOTS:
        for model, where in models_of(root).items():
            found.setdefault(model, where)
    return found


def attribute_docstrings(model: type[BaseModel]) -> set[str]:
    """Names of the fields written in ``model``'s own class body followed by a string literal."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    documented = set()
    for statement, following in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
            and following.value.value.strip()
        ):
            documented.add(statement.target.id)
    return documented


def own_fields(model: type[BaseModel]) -> list[str]:
    """The fields ``model`` declares itself (not inherited from a config base)."""
    return [name for name in model.model_fields if name in inspect.get_annotations(model)]


def test_every_role_config_root_is_walked() -> None:
    """A class of the packages deriving from RoleConfig (found in their source) is one of ROOTS."""
    walked = {(root.__module__, root.__name__) for root in ROOTS}
    declared = set()
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                bases = [base.id for base in getattr(node, "bases", []) if isinstance(base, ast.Name)]
                if isinstance(node, ast.ClassDef) and "RoleConfig" in bases:
                    module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
                    declared.add((module, node.name))
    assert declared, "no RoleConfig subclass found in the packages"
    assert declared <= walked, f"role configs the checks below do not walk: {sorted(declared - walked)}"


def test_the_walk_reaches_nested_union_and_shared_sections() -> None:
    names = {model.__name__ for model in reachable()}
    expected = {"ApiConfig", "OptimizerConfig", "P2PConfig", "CoordinatorP2PConfig", "LossConfig"}
    expected |= {"BuiltinEnvConfig", "ReasoningGymEnvConfig", "VerifiersEnvConfig", "PythonEnvConfig"}
    assert expected <= names, sorted(expected - names)


def test_every_field_has_a_docstring() -> None:
    missing = [
        f"{where}: {model.__name__}.{name}"
        for model, where in reachable().items()
        for name, field in model.model_fields.items()
        if not (field.description and field.description.strip())
    ]
    assert not missing, "config fields without a docstring (a string literal right after the field):\n" + "\n".join(
        missing
    )


def test_docstrings_are_read_from_the_source() -> None:
    """What pydantic reports is the class body's literal: the two ways of reading it agree."""
    disagreeing = []
    for model, where in reachable().items():
        documented = attribute_docstrings(model)
        for name in own_fields(model):
            description = model.model_fields[name].description
            if (name in documented) != bool(description):
                disagreeing.append(f"{where}: {model.__name__}.{name}")
    assert not disagreeing, "fields whose docstring pydantic did not pick up:\n" + "\n".join(disagreeing)


def test_every_field_has_a_default() -> None:
    missing = [
        f"{where}: {model.__name__}.{name}"
        for model, where in reachable().items()
        for name, field in model.model_fields.items()
        if field.is_required() and (model.__name__, name) not in REQUIRED_BY_DESIGN
    ]
    assert not missing, "config fields without a default:\n" + "\n".join(missing)


def test_the_checks_catch_an_undocumented_field_and_a_missing_default() -> None:
    class Inner(Section):
        documented: int = 1
        """Has both."""
        bare: int = 2
        required: str = Field(min_length=1)
        """Has no default."""

    class Root(RoleConfig):
        inner: Inner | None = None
        """An optional section."""

    tables = config_tables(Root)
    assert [(t.key, t.model, t.optional) for t in tables] == [("", Root, False), ("inner", Inner, True)]
    assert Inner.model_fields["documented"].description == "Has both."
    assert Inner.model_fields["bare"].description is None
    assert attribute_docstrings(Inner) == {"documented", "required"}
    assert Inner.model_fields["required"].is_required()
