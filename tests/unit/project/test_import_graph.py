"""The package graph: the ladder of docs/architecture.md, no import cycle (imports inside functions count), and
no role importing another role."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGES = (
    "environments",
    "engines",
    "node",
    "protocol",
    "runtime",
    "coordinator",
    "worker",
    "validator",
    "trainer",
    "toploc",
    "shardcast",
)
ROLES = ("worker", "validator", "trainer")
# The rungs of the ladder, bottom first: a package imports only from its own rung or the rungs below.
RUNGS: tuple[tuple[str, ...], ...] = (
    ("protocol",),
    ("runtime",),
    ("toploc", "shardcast", "environments", "engines", "node"),
    ROLES,
    ("coordinator",),
)
# Inside the coordinator: the ledger at the bottom, serving on top.
COORDINATOR_RUNGS: tuple[tuple[str, ...], ...] = (("ledger",), ("loop", "processes"), ("serving",))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every module ``module`` imports when some code path runs (``if TYPE_CHECKING:`` blocks left out)."""
    found: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def package_graph() -> dict[str, set[str]]:
    """Our modules and the modules of ours each one imports."""
    files = {_module_name(p): p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        imported = _imported(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py")
        graph[module] = {name for name in imported if name in files and name != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_detector_sees_a_cycle_through_an_import_inside_a_function() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("import os\nfrom x.y import z\ndef f():\n    from . import w\nif TYPE_CHECKING:\n    import q\n")
    assert _imported(tree, "x.v", False) == {"os", "x.y", "x.y.z", "x", "x.w"}


def test_no_import_cycles() -> None:
    assert cycles(package_graph()) == []


def test_no_role_imports_another_role() -> None:
    crossings = sorted(
        f"{module} -> {target}"
        for module, targets in package_graph().items()
        for target in targets
        if module.split(".")[0] in ROLES
        and target.split(".")[0] in ROLES
        and module.split(".")[0] != target.split(".")[0]
    )
    assert crossings == []


def _rung(name: str, rungs: tuple[tuple[str, ...], ...]) -> int | None:
    return next((i for i, rung in enumerate(rungs) if name in rung), None)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that climbs the ladder, at the top level and inside the coordinator."""
    climbs = []
    for module, targets in graph.items():
        for target in targets:
            low, high = _rung(module.split(".")[0], RUNGS), _rung(target.split(".")[0], RUNGS)
            if low is not None and high is not None and high > low:
                climbs.append(f"{module} -> {target}")
            inner = (module.split(".")[1:2], target.split(".")[1:2])
            if module.startswith("coordinator.") and target.startswith("coordinator.") and all(inner):
                low, high = _rung(inner[0][0], COORDINATOR_RUNGS), _rung(inner[1][0], COORDINATOR_RUNGS)
                if low is not None and high is not None and high > low:
                    climbs.append(f"{module} -> {target}")
    return sorted(climbs)


def test_every_package_is_on_a_rung() -> None:
    on_rungs = {name for rung in RUNGS for name in rung}
    assert set(PACKAGES) == on_rungs
    subpackages = {p.name for p in (REPO_ROOT / "coordinator").iterdir() if (p / "__init__.py").exists()}
    assert subpackages == {name for rung in COORDINATOR_RUNGS for name in rung}


def test_the_ladder_detector_sees_a_climb() -> None:
    graph = {
        "protocol.x": {"worker.loop"},
        "coordinator.ledger.ledger.a": {"coordinator.serving.b"},
        "worker.a": {"protocol.x"},
    }
    assert upward_imports(graph) == [
        "coordinator.ledger.ledger.a -> coordinator.serving.b",
        "protocol.x -> worker.loop",
    ]


def test_no_package_imports_from_a_rung_above_it() -> None:
    assert upward_imports(package_graph()) == []
