"""No function of the project runs past 100 lines: a longer one is split into named parts.

Every package, bench/ and tests/support/ are checked (tests themselves are not), nested functions and methods
included, from the ``def`` line to the last line of the body.
"""

from __future__ import annotations

import ast
from pathlib import Path

from runtime.file_map import mapped_files

REPO_ROOT = Path(__file__).resolve().parents[3]
MAX_FUNCTION_LINES = 100


def long_functions(root: Path = REPO_ROOT, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` for every function longer than ``limit`` lines in the mapped files."""
    found = []
    for path in mapped_files(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                num_lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if num_lines > limit:
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({num_lines} lines)")
    return found


def test_no_function_is_over_the_limit() -> None:
    assert long_functions() == [], f"split these into named parts of at most {MAX_FUNCTION_LINES} lines"


def _function(name: str, num_lines: int, indent: str = "") -> str:
    """A function of exactly ``num_lines`` lines."""
    body = "".join(f"{indent}    x_{i} = {i}\n" for i in range(num_lines - 1))
    return f"{indent}def {name}() -> None:\n{body}"


def test_a_planted_long_function_is_found(tmp_path: Path) -> None:
    package = tmp_path / "demo"
    package.mkdir()
    (package / "__init__.py").write_text('"""A demo package."""\n')
    (package / "fits.py").write_text(_function("fits", MAX_FUNCTION_LINES))
    (package / "over.py").write_text("class Runner:\n" + _function("run", MAX_FUNCTION_LINES + 1, indent="    "))
    assert long_functions(tmp_path) == [f"demo/over.py:2 run ({MAX_FUNCTION_LINES + 1} lines)"]
