"""Parse a command line with our own console scripts (pyproject's ``[project.scripts]``) without running it.

Docs and deployment files show ``prime-*`` command lines; tests check them here so a renamed
subcommand or flag fails a test. :func:`parse_command` resolves nested subcommands
(``prime-worker keys show``) with click's parser and returns the leaf's context: options and
arguments converted and validated, the command's function never called.
"""

from __future__ import annotations

import importlib
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import typer

REPO_ROOT = Path(__file__).resolve().parents[2]


@cache
def console_scripts() -> dict[str, str]:
    """Script name -> ``module:attribute`` of each console script the package installs."""
    scripts: dict[str, str] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts


def cli_app(script: str) -> typer.Typer:
    """The typer app behind one of our console scripts."""
    target = console_scripts().get(script)
    assert target is not None, f"{script} is not one of our console scripts ({', '.join(console_scripts())})"
    module, attribute = target.split(":")
    app = getattr(importlib.import_module(module), attribute)
    assert isinstance(app, typer.Typer), f"{target} is not a typer app"
    return app


def parse_command(argv: list[str], *, resilient: bool = False) -> Any:
    """Parse ``argv`` down to its leaf subcommand without running it; return the leaf's click context.

    Unknown subcommands and options raise; with ``resilient`` missing required options and
    arguments are tolerated (for a command shown in passing, such as ``prime-trainer node``).
    """
    command: Any = typer.main.get_command(cli_app(argv[0]))
    name, args = argv[0], list(argv[1:])
    parent: Any = None
    while hasattr(command, "commands"):  # a group: the next word names the subcommand
        assert args and not args[0].startswith("-"), f"{' '.join(argv)}: no subcommand of {name} given"
        context = command.make_context(name, [args[0], "--help"], parent=parent, resilient_parsing=True)
        sub = command.get_command(context, args[0])
        assert sub is not None, f"{' '.join(argv)}: {name} has no subcommand {args[0]!r}"
        command, name, args, parent = sub, args[0], args[1:], context
    return command.make_context(name, args, parent=parent, resilient_parsing=resilient)
