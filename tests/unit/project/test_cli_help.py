"""Every command's --help renders cleanly: nothing in a help text is eaten by rich markup.

Typer renders help with rich, which reads ``[word]`` as a style tag and drops it; a docstring
naming a config section that way showed empty backticks. This renders the help of every
command and subcommand of every console script and checks for what such losses leave behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.support.cli_parse import cli_app, console_scripts

LEFTOVERS = ("``", "()", "( )", "[]")


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from command_paths(sub, (*path, name))


def every_command() -> list[tuple[str, tuple[str, ...]]]:
    return [
        (script, path)
        for script in sorted(console_scripts())
        for path in command_paths(typer.main.get_command(cli_app(script)))
    ]


@pytest.mark.parametrize(("script", "path"), every_command(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_help_renders_without_markup_losses(script: str, path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli_app(script), [*path, "--help"], prog_name=script, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    lost = [leftover for leftover in LEFTOVERS if leftover in result.output]
    assert not lost, f"{script} {' '.join(path)} --help shows {lost}:\n{result.output}"


def test_every_script_has_subcommands_to_check() -> None:
    assert len(every_command()) >= 2 * len(console_scripts())
