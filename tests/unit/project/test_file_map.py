"""docs/files.md is what :mod:`runtime.file_map` makes from the modules' docstrings now.

A module added, moved or re-described without regenerating the page fails here, with the command that
regenerates it; so does a mapped module without a docstring.
"""

from __future__ import annotations

from pathlib import Path

from runtime.file_map import COMMAND, file_map, first_line, mapped_files, modules
from tests.support.generated_pages import assert_page_is_fresh

REPO_ROOT = Path(__file__).resolve().parents[3]
PAGE = REPO_ROOT / "docs" / "files.md"


def test_the_committed_file_map_is_up_to_date() -> None:
    assert_page_is_fresh(PAGE, file_map(), COMMAND, "file-map")


def test_every_mapped_module_says_what_it_is() -> None:
    undescribed = [module.path for module in modules() if not module.summary]
    assert not undescribed, f"modules without a docstring (the file map's line for them): {undescribed}"


def test_the_map_covers_the_packages_and_shared_test_support_only() -> None:
    paths = {path.relative_to(REPO_ROOT).as_posix() for path in mapped_files()}
    assert "coordinator/ledger/leasing.py" in paths and "bench/record.py" in paths
    assert "tests/support/coordinator_process.py" in paths
    assert not any(path.startswith("tests/unit/") or path.startswith("tests/integration/") for path in paths)


def test_a_planted_module_makes_the_page_stale(tmp_path: Path) -> None:
    package = tmp_path / "demo"
    package.mkdir()
    (package / "__init__.py").write_text('"""A demo package."""\n')
    before = file_map(tmp_path)
    (package / "extra.py").write_text('"""The extra part: it does one thing.\n\nMore prose.\n"""\n')
    after = file_map(tmp_path)
    assert before != after and "| [extra.py](../demo/extra.py) | The extra part: it does one thing. |" in after
    (package / "bare.py").write_text("x = 1\n")
    assert [module.path for module in modules(tmp_path) if not module.summary] == ["demo/bare.py"]


def test_the_first_line_is_the_docstring_summary() -> None:
    assert first_line('"""One line.\n\nMore."""\nx = 1\n') == "One line."
    assert first_line("x = 1\n") == ""
