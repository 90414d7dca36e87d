"""Console scripts: --help without torch or vllm; any failure one line and an exit code (bad configs 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from protocol.errors import ConfigError, StartupError
from runtime.cli import EXIT_BAD_CONFIG

SCRIPTS = {
    "prime-coordinator": "coordinator.cli",
    "prime-worker": "worker.cli",
    "prime-relay": "shardcast.cli",
    "prime-validator": "validator.cli",
    "prime-trainer": "trainer.cli",
}
PROBE = """
import sys
from {module} import app
from typer.testing import CliRunner
result = CliRunner().invoke(app, ["--help"])
assert result.exit_code == 0, result.output
assert "Usage" in result.output
heavy = sorted(m for m in ("torch", "vllm", "transformers", "safetensors", "libp2p", "trio") if m in sys.modules)
print(",".join(heavy))
"""


@pytest.mark.parametrize("module", SCRIPTS.values())
def test_help_does_not_import_heavy_libraries(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"{module} --help imported {done.stdout.strip()}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_scripts_are_installed(script: str) -> None:
    path = Path(sys.executable).parent / script
    done = subprocess.run([str(path), "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout


def test_bad_config_key_exits_2_naming_key_and_file(tmp_path: Path) -> None:
    from coordinator.cli import app

    path = tmp_path / "run.toml"
    path.write_text("[api]\nprot = 1\n")
    result = CliRunner().invoke(app, ["start", "-c", str(path)])
    assert result.exit_code == EXIT_BAD_CONFIG
    assert "api.prot" in result.output and "run.toml" in result.output


def test_keys_create_makes_a_0600_key_that_show_prints(tmp_path: Path) -> None:
    from worker.cli import app

    created = CliRunner().invoke(app, ["keys", "create", "--data-dir", str(tmp_path)])
    shown = CliRunner().invoke(app, ["keys", "show", "--data-dir", str(tmp_path)])
    again = CliRunner().invoke(app, ["keys", "create", "--data-dir", str(tmp_path)])
    assert created.exit_code == 0 and shown.exit_code == 0, created.output + shown.output
    assert "12D3KooW" in created.output
    assert created.output == shown.output == again.output
    assert (tmp_path / "node_key.pem").stat().st_mode & 0o777 == 0o600


def test_keys_show_creates_nothing_and_names_the_command_that_does(tmp_path: Path) -> None:
    from validator.cli import app

    result = CliRunner().invoke(app, ["keys", "show", "--data-dir", str(tmp_path / "node")])
    assert result.exit_code == 1
    assert "no node key in" in result.output and "prime-validator keys create" in result.output
    assert not (tmp_path / "node").exists()


def test_keys_show_finds_the_key_through_the_config(tmp_path: Path) -> None:
    from coordinator.cli import app

    run_dir = tmp_path / "my-run"
    config = tmp_path / "run.toml"
    config.write_text(f'data_dir = "{run_dir}"\n')
    created = CliRunner().invoke(app, ["keys", "create", "--data-dir", str(run_dir)])
    by_file = CliRunner().invoke(app, ["keys", "show", "-c", str(config)])
    by_set = CliRunner().invoke(app, ["keys", "show", "--set", f'data_dir="{run_dir}"'])
    assert created.exit_code == by_file.exit_code == by_set.exit_code == 0, by_file.output + by_set.output
    assert created.output == by_file.output == by_set.output
    bare = CliRunner().invoke(app, ["keys", "show", "-c", str(config), "--id-only"])
    assert bare.output.strip() == created.output.split()[2] and bare.output.startswith("12D3KooW")


@pytest.mark.parametrize("script", ["coordinator", "worker", "validator", "trainer", "trainer-eval", "shardcast"])
def test_each_help_shows_a_set_example_its_own_config_accepts(script: str) -> None:
    import importlib
    import re

    app = importlib.import_module(f"{script.split('-')[0]}.cli").app
    commands = {
        "coordinator": ["start"],
        "worker": ["join"],
        "validator": ["run"],
        "trainer": ["rl"],
        "trainer-eval": ["eval"],
        "shardcast": ["serve"],
    }[script]
    result = CliRunner().invoke(app, [*commands, "--help"])
    text = " ".join(result.output.replace("│", " ").split())  # rich's help box, unwrapped
    example = re.search(r"--set ([a-z_.]+=\S+?)[ )]", text)
    assert example, result.output
    which = {"trainer": ["rl"], "trainer-eval": ["eval"]}.get(script, [])
    shown = CliRunner().invoke(app, ["config", "show", *which, "--set", example[1]])
    assert shown.exit_code == 0, (example[1], shown.output)


def failing_app(error: BaseException) -> typer.Typer:
    """A PrimeTyper whose one command raises ``error`` (after setting up logging like every command)."""
    from runtime.cli import LogLevelOption, PrimeTyper, start_logging

    app = PrimeTyper(help="test")

    @app.command()
    def fail_now(log_level: str = LogLevelOption) -> None:
        start_logging(log_level, json_logs=False)
        raise error

    @app.command()
    def other() -> None:
        """A second command, so that the first is a subcommand as in our scripts."""

    return app


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (
            StartupError("the port is taken", "pick another with --port"),
            1,
            "error: the port is taken; pick another with --port",
        ),
        (ConfigError("key 'x' is wrong"), EXIT_BAD_CONFIG, "error: key 'x' is wrong"),
        (
            RuntimeError("disk on fire\nand more"),
            1,
            "error: unexpected RuntimeError: disk on fire; and more; run again with --log-level debug for the "
            "traceback, and report it if the cause is not yours",
        ),
        (
            ModuleNotFoundError("No module named 'foo.bar'", name="foo.bar"),
            1,
            "error: the Python package 'foo.bar' is not installed; install it (pip install foo) or the extra of "
            "prime-network that needs it",
        ),
    ],
)
def test_any_error_of_a_command_is_one_line_and_an_exit_code(
    error: BaseException, code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        failing_app(error)(["fail-now"], prog_name="prime-test")
    assert exited.value.code == code
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [line]


def test_the_traceback_comes_with_log_level_debug(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        failing_app(RuntimeError("boom"))(["fail-now", "--log-level", "debug"], prog_name="prime-test")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "raise error" in err
    assert err.strip().splitlines()[-1].startswith("error: unexpected RuntimeError: boom")


def test_fail_prints_the_message_verbatim_brackets_included(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from runtime.cli import fail

    with pytest.raises(typer.Exit):
        fail("set [environment] to the run's, not ['a']")
    assert "set [environment] to the run's, not ['a']" in " ".join(capsys.readouterr().err.split())


def test_fail_shows_another_partys_escapes_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """The line a command stops on may quote a coordinator's or an environment's text: its escapes are shown."""
    import typer

    from runtime.cli import fail

    with pytest.raises(typer.Exit):
        fail("the coordinator refused: \x1b[2Jgone\x07")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "refused: \\x1b[2Jgone\\x07" in err, err
