"""docs/config-reference.md is what :mod:`runtime.config_reference` makes from the config models now.

A changed field, default or docstring without regenerating the page fails here, with the command
that regenerates it. The page does not depend on who makes it (home directories are written
``~``), and it covers every role config the generator is told about.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime.config_reference import COMMAND, ROLES, _home_relative, reference, role_config, type_name
from tests.support.generated_pages import assert_page_is_fresh
from tests.unit.runtime.test_config_docs import ROOTS

REPO_ROOT = Path(__file__).resolve().parents[3]
PAGE = REPO_ROOT / "docs" / "config-reference.md"


def test_the_committed_reference_is_up_to_date() -> None:
    assert_page_is_fresh(PAGE, reference(), COMMAND, "config-reference")


def test_the_module_writes_the_page_to_stdout() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runtime.config_reference"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout == reference()


def test_every_role_config_is_in_the_reference() -> None:
    assert {role_config(role) for role in ROLES} == set(ROOTS)


def test_the_page_does_not_depend_on_the_home_directory() -> None:
    home = str(Path.home())
    assert _home_relative(f"{home}/.prime-network/worker") == "~/.prime-network/worker"
    assert _home_relative(f"{home}x/a") == f"{home}x/a"
    assert home not in reference() or home in ("/", "")
    assert '`"~/.prime-network/worker"`' in reference()


def test_types_read_as_an_operator_writes_them() -> None:
    from typing import Literal

    assert type_name(int | None) == "int or unset"
    assert type_name(list[str]) == "list of str"
    assert type_name(Literal["mask", "clip"]) == '"mask" or "clip"'
    assert type_name(tuple[float, float]) == "[float, float]"
    assert type_name(Path) == "path"


def test_the_reference_names_each_table_and_variant() -> None:
    page = reference()
    for heading in (
        "### `[orchestrator.trainer_launch]`",
        "### `[toploc]`",
        '#### `[environment]` with `type = "reasoning_gym"`',
        "## Trainer: local RL",
    ):
        assert heading in page, heading
    assert "| `environment.dataset` | str" in page and "| required |" in page
