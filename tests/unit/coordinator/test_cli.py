"""`prime-coordinator start` says honestly what it runs, and refuses an environment it cannot load."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from coordinator.cli import app
from runtime.cli import EXIT_BAD_CONFIG


def test_help_says_what_start_runs_today() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "task ledger API" in result.output and "RL loop" in result.output


def test_unloadable_environment_fails_with_its_name(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    section = '[environment]\ntype = "python"\ntarget = "no_such_module:tasks"\n'
    config.write_text(f'data_dir = "{tmp_path}"\n{section}')
    result = CliRunner().invoke(app, ["start", "-c", str(config), "--port", "0"])
    assert result.exit_code == EXIT_BAD_CONFIG
    assert "no_such_module:tasks" in result.output
