"""`<role> config show`: the resolved config (file < environment < --set) as TOML, secrets masked.

Run through typer's CliRunner on every role's app: values from the file, the environment and
``--set`` appear; the output is TOML that loads back to the same config (so it can be kept as
the run's exact settings); URL passwords are masked; a bad key is the one-line config error with
exit code 2, as every other command gives it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from protocol.identity import NodeIdentity
from runtime.cli import EXIT_BAD_CONFIG
from runtime.config import Section, config_to_toml, load_config, mask_secrets
from tests.support.cli_parse import cli_app
from tests.unit.runtime.test_config import SHIPPED, _kind

# The `config show` arguments that pick a config class, by script.
SHOW: dict[str, list[str]] = {
    "prime-coordinator": ["config", "show"],
    "prime-worker": ["config", "show"],
    "prime-validator": ["config", "show"],
    "prime-relay": ["config", "show"],
    "prime-trainer": ["config", "show", "rl"],
}
SCRIPT_BY_CLASS = {
    "CoordinatorConfig": ["prime-coordinator", "config", "show"],
    "WorkerConfig": ["prime-worker", "config", "show"],
    "ValidatorConfig": ["prime-validator", "config", "show"],
    "RelayConfig": ["prime-relay", "config", "show"],
    "SftConfig": ["prime-trainer", "config", "show", "sft"],
    "RlConfig": ["prime-trainer", "config", "show", "rl"],
    "EvalConfig": ["prime-trainer", "config", "show", "eval"],
}


def show(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli_app(argv[0]), argv[1:], env=env)
    return result.exit_code, result.stdout, result.stderr


def body(output: str) -> dict[str, object]:
    return tomllib.loads(output)


@pytest.mark.parametrize("script", SHOW)
def test_every_role_shows_its_config_with_file_and_set_values(script: str, tmp_path: Path) -> None:
    path = tmp_path / "role.toml"
    path.write_text('data_dir = "/srv/from-file"\n' if script != "prime-trainer" else 'output_dir = "/srv/from-file"\n')
    node_id = NodeIdentity.generate().node_id
    key = "num_steps=7" if script == "prime-trainer" else f"coordinator_id='{node_id}'"
    if script == "prime-coordinator":
        key = "api.port=8123"
    code, out, err = show([script, *SHOW[script], "-c", str(path), "--set", key])
    assert code == 0, err
    shown = body(out)
    assert "/srv/from-file" in out
    assert out.startswith("#") and str(path) in out.splitlines()[0]
    if script == "prime-coordinator":
        assert shown["api"] == {**shown["api"], "port": 8123}  # type: ignore[dict-item]
    elif script == "prime-trainer":
        assert shown["num_steps"] == 7
    else:
        assert shown["coordinator_id"] == node_id


def test_the_environment_sits_between_the_file_and_set(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[api]\nport = 1111\nnum_threads = 2\n")
    env = {"PRIME_COORDINATOR_API__PORT": "2222", "PRIME_COORDINATOR_API__NUM_THREADS": "3"}
    code, out, err = show(["prime-coordinator", "config", "show", "-c", str(path), "--set", "api.port=3333"], env)
    assert code == 0, err
    api = body(out)["api"]
    assert isinstance(api, dict) and (api["port"], api["num_threads"]) == (3333, 3)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_what_is_shown_loads_back_to_the_same_config(path: Path, tmp_path: Path) -> None:
    cls = _kind(path)
    argv = SCRIPT_BY_CLASS[cls.__name__]
    code, out, err = show([*argv, "-c", str(path)])
    assert code == 0, err
    saved = tmp_path / "resolved.toml"
    saved.write_text(out)
    assert load_config(cls, saved).model_dump() == load_config(cls, path).model_dump()


def test_unset_keys_are_comments_and_sections_are_tables() -> None:
    code, out, err = show(["prime-validator", "config", "show"])
    assert code == 0, err
    assert "# coordinator_id is unset" in out and "# environment is unset" in out
    assert "\n[toploc]\n" in out and "\n[p2p]\n" in out


def test_a_password_in_a_url_is_masked() -> None:
    url = "postgresql+psycopg://prime:hunter2@db:5432/prime"
    code, out, err = show(["prime-coordinator", "config", "show", "--set", f"ledger.url='{url}'"])
    assert code == 0, err
    assert "hunter2" not in out
    ledger = body(out)["ledger"]
    assert isinstance(ledger, dict) and ledger["url"] == "postgresql+psycopg://prime:***@db:5432/prime"
    assert mask_secrets("sqlite:///runs/x/ledger.db") == "sqlite:///runs/x/ledger.db"
    assert mask_secrets("http://user@host:8000/x") == "http://user@host:8000/x"


@pytest.mark.parametrize("script", SHOW)
def test_a_bad_key_is_one_line_and_exit_code_2(script: str) -> None:
    code, out, err = show([script, *SHOW[script], "--set", "no_such_key=1"])
    assert code == EXIT_BAD_CONFIG
    assert out == ""
    assert err.count("\n") == 1 and "unknown key 'no_such_key'" in err


def test_the_trainer_names_the_command_whose_config_it_shows() -> None:
    code, out, err = show(["prime-trainer", "config", "show", "sft"])
    assert code == 0 and "SftConfig" in out.splitlines()[0], err
    code, out, err = show(["prime-trainer", "config", "show", "train"])
    assert code == EXIT_BAD_CONFIG and "choose one of sft, rl, eval" in err


def test_the_help_teaches_the_order_and_the_flags() -> None:
    result = CliRunner().invoke(cli_app("prime-coordinator"), ["config", "show", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for phrase in ("-c", "PRIME_COORDINATOR_*", "--set KEY=VALUE", "exit code 2", "> resolved.toml"):
        assert phrase in text, phrase


def test_strings_that_need_escaping_survive() -> None:
    class Odd(Section):
        text: str = 'quote " backslash \\ tab \t newline \n del \x7f é'
        """A string with every character TOML escapes."""
        weird: dict[str, int] = Field(default_factory=lambda: {"key with space": 1, "dotted.key": 2})
        """Keys that are not bare."""
        ratio: float = 1e-8
        """A float in exponent form."""

    assert tomllib.loads(config_to_toml(Odd())) == Odd().model_dump(mode="json")


def test_the_config_group_is_on_every_role_app() -> None:
    for script in SHOW:
        group = typer.main.get_command(cli_app(script))
        assert "config" in group.commands, script  # type: ignore[attr-defined]
