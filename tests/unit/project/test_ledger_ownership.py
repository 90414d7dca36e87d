"""The ledger owns its tables: outside ``coordinator/ledger/`` no module imports the table definitions, the schema
migrations or the ledger's core, and none reaches into a ledger object's core or private attributes
(``ledger.core``, ``ledger._write``, ``views._run``...). Inside, the ledger is a core and parts built on it, not a
tower of classes: no ledger class extends another.

Code that needs the ledger's data asks a public method (the views, the train steps, the leasing and validation
calls); tests of the ledger itself may read its tables and are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

from runtime.file_map import mapped_files

REPO_ROOT = Path(__file__).resolve().parents[3]
OWNER = "coordinator/ledger/"
PRIVATE_MODULES = (
    "coordinator.ledger.storage.tables",
    "coordinator.ledger.storage.migrations",
    "coordinator.ledger.core",
)
LEDGER_NAMES = frozenset({"ledger", "views", "ledger_views"})
"""Names a ledger object goes by; ``X._name`` with X one of these (or ``self.X``) is a private access."""


def _holder_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def violations(root: Path) -> list[str]:
    """``path:line what`` for each import of a private ledger module and each private access to a ledger object, in
    the project's modules (every package, bench/ and tests/support/: :func:`runtime.file_map.mapped_files`)."""
    found = []
    for path in mapped_files(root):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(OWNER):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                if any(name in PRIVATE_MODULES for name in names):
                    found.append(f"{relative}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in PRIVATE_MODULES:
                        found.append(f"{relative}:{node.lineno} imports {alias.name}")
            elif (
                isinstance(node, ast.Attribute)
                and (node.attr == "core" or (node.attr.startswith("_") and not node.attr.startswith("__")))
                and _holder_name(node.value) in LEDGER_NAMES
            ):
                found.append(f"{relative}:{node.lineno} uses {_holder_name(node.value)}.{node.attr}")
    return found


def towers(root: Path) -> list[str]:
    """``path:line class Name(Base)`` for each class in ``coordinator/ledger/`` that extends another of its classes."""
    ledger_dir = root / OWNER
    modules = [ast.parse(path.read_text(encoding="utf-8")) for path in sorted(ledger_dir.rglob("*.py"))]
    classes = {node.name for tree in modules for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = []
    for path in sorted(ledger_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if _holder_name(base) in classes:
                        relative = path.relative_to(root).as_posix()
                        found.append(f"{relative}:{node.lineno} class {node.name}({_holder_name(base)})")
    return found


def test_nothing_outside_the_ledger_touches_its_tables_or_private_methods() -> None:
    assert violations(REPO_ROOT) == []


def test_the_ledger_parts_are_built_on_its_core_not_on_each_other() -> None:
    assert towers(REPO_ROOT) == []


def test_a_planted_violation_is_found(tmp_path: Path) -> None:
    role = tmp_path / "coordinator" / "loop"
    role.mkdir(parents=True)
    (tmp_path / "coordinator" / "__init__.py").write_text('"""The planted package."""\n')
    (role / "steps.py").write_text(
        "from coordinator.ledger.storage.tables import nodes\n"
        "def record(self):\n"
        "    with self.ledger._write(None) as conn:\n"
        "        return self.ledger.core.secret\n"
    )
    owner = tmp_path / "coordinator" / "ledger"
    owner.mkdir()
    (owner / "part.py").write_text("from coordinator.ledger.storage.tables import nodes\nledger._run(None)\n")
    assert violations(tmp_path) == [
        "coordinator/loop/steps.py:1 imports coordinator.ledger.storage.tables",
        "coordinator/loop/steps.py:3 uses ledger._write",
        "coordinator/loop/steps.py:4 uses ledger.core",
    ]
    (owner / "tower.py").write_text("class Core:\n    pass\n\n\nclass Part(Core):\n    pass\n")
    assert towers(tmp_path) == ["coordinator/ledger/tower.py:5 class Part(Core)"]
