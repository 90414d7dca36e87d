"""bench/'s shape: no bench module imports a bench program (the length of its functions is checked with every
package's, in test_function_length.py).

A bench program is a module of bench/ with an ``if __name__ == "__main__":`` block; what programs share lives
in modules without one (bench/record.py, which runs other benches and is imported for its provenance helpers,
is the one shared module that also runs: :data:`SHARED_AND_RUN`). Imports count wherever they stand, inside
functions too. Every module's docstring is checked by tests/unit/project/test_file_map.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.project.test_import_graph import _imported

REPO_ROOT = Path(__file__).resolve().parents[3]
SHARED_AND_RUN = ("bench.record",)
"""Modules of bench/ with a ``__main__`` block that are shared all the same: bench modules may import them."""


def _bench_modules(root: Path) -> dict[str, tuple[Path, ast.Module]]:
    """Every module under ``root``/bench by dotted name (``bench.x``; a package by its own name), parsed."""
    found = {}
    for path in sorted((root / "bench").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = (path, ast.parse(path.read_text(), str(path)))
    return found


def _runs_as_main(tree: ast.Module) -> bool:
    """Whether the module has a top-level ``if __name__ == "__main__":`` block."""
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            sides = [node.test.left, *node.test.comparators]
            names = {side.id for side in sides if isinstance(side, ast.Name)}
            values = {side.value for side in sides if isinstance(side, ast.Constant)}
            if names == {"__name__"} and values == {"__main__"}:
                return True
    return False


def bench_programs(root: Path = REPO_ROOT) -> set[str]:
    """The bench programs under ``root``: modules of bench/ run as ``__main__``, but for :data:`SHARED_AND_RUN`."""
    modules = _bench_modules(root)
    return {name for name, (_, tree) in modules.items() if _runs_as_main(tree) and name not in SHARED_AND_RUN}


def program_imports(root: Path = REPO_ROOT) -> list[str]:
    """Every import of a bench program by another module of bench/, as ``importer imports program``."""
    programs = bench_programs(root)
    found = []
    for name, (path, tree) in _bench_modules(root).items():
        imported = _imported(tree, name, path.name == "__init__.py")
        found += [f"{name} imports {program}" for program in sorted(imported & programs - {name})]
    return found


def test_no_bench_module_imports_a_bench_program() -> None:
    assert program_imports() == [], "move what programs share to a bench module without a __main__ block"


def test_the_programs_are_the_runnable_benches_and_not_what_they_share() -> None:
    programs = bench_programs()
    assert {"bench.shardcast_bench", "bench.ledger_load", "bench.toploc_calibrate", "bench.rollout_bench"} <= programs
    shared = {"bench", "bench.record", "bench.runs", "bench.venvs", "bench.load_client", "bench.polling"}
    shared |= {"bench.rollout_tasks", "bench.shardcast_clients", "bench.toploc_tasks"}
    assert not shared & programs


def _plant(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (name -> source) into ``root``/bench."""
    for name, text in files.items():
        path = root / "bench" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _program(top: str = "", body: str = "pass") -> str:
    """The source of a bench program: ``top``, then a ``main`` doing ``body``, run as ``__main__``."""
    return f'{top}\n\n\ndef main() -> None:\n    {body}\n\n\nif __name__ == "__main__":\n    main()\n'


def test_a_planted_program_import_is_found_wherever_it_stands(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        {
            "__init__.py": '"""Benches."""\n',
            "one_bench.py": _program(),
            "two_bench.py": _program(body="from bench.one_bench import main"),
            "three_bench.py": _program("from . import one_bench"),
            "shared.py": "import bench.two_bench\n",
            "record.py": _program("ROOT = 1"),
            "fine_bench.py": _program("from bench.record import ROOT\nfrom bench.shared import x"),
        },
    )
    assert bench_programs(tmp_path) == {"bench.one_bench", "bench.two_bench", "bench.three_bench", "bench.fine_bench"}
    assert sorted(program_imports(tmp_path)) == [
        "bench.shared imports bench.two_bench",
        "bench.three_bench imports bench.one_bench",
        "bench.two_bench imports bench.one_bench",
    ]
