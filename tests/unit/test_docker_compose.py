"""docker-compose.yml: valid for Compose, one service per role, each running a real command of ours.

`docker-compose config` (Debian's docker-compose package; .ci/run installs it) validates and
normalises the file. Every service's command is then parsed by the same typer CLI a person
runs, so a renamed flag or subcommand breaks this test instead of the deployment; the config
files the commands name are loaded with their role's config model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE_SERVICES = {"coordinator", "relay", "worker", "validator"}


def compose_config() -> dict[str, Any]:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is not installed (.ci/run installs Debian's docker-compose)")
        pytest.skip("docker-compose is not installed here (apt-get install docker-compose)")
    done = subprocess.run(
        [binary, "-f", str(REPO_ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COORDINATOR_ID": ""},
    )
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def cli_app(script: str) -> typer.Typer:
    from coordinator.cli import app as coordinator
    from shardcast.cli import app as relay
    from validator.cli import app as validator
    from worker.cli import app as worker

    apps = {
        "prime-coordinator": coordinator,
        "prime-relay": relay,
        "prime-worker": worker,
        "prime-validator": validator,
    }
    assert script in apps, f"{script} is not one of our role commands"
    return apps[script]


def parse_command(argv: list[str]) -> Any:
    """Parse ``argv`` with our CLI down to the subcommand, without running it (returns its context)."""
    group: Any = typer.main.get_command(cli_app(argv[0]))
    context = group.make_context(argv[0], [argv[1], "--help"], resilient_parsing=True)
    sub = group.get_command(context, argv[1])
    assert sub is not None, f"{argv}: {argv[0]} has no subcommand {argv[1]}"
    return sub.make_context(argv[1], argv[2:], parent=context)


def test_compose_file_is_valid_and_has_every_role() -> None:
    services = compose_config()["services"]
    assert ROLE_SERVICES | {"postgres"} <= set(services)
    assert "postgresql" in services["coordinator"]["environment"]["PRIME_COORDINATOR_LEDGER__URL"]
    assert services["coordinator"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device["capabilities"] for device in devices)


def test_every_service_runs_a_command_our_cli_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.config import CoordinatorConfig
    from protocol.config import load_config

    services = compose_config()["services"]
    for name, value in services["coordinator"]["environment"].items():
        monkeypatch.setenv(name, str(value))
    for name in sorted(ROLE_SERVICES):
        argv = services[name]["command"]
        context = parse_command(argv)
        config_path = context.params.get("config")
        if config_path is not None and name == "coordinator":  # the file and the service's environment both apply
            config = load_config(CoordinatorConfig, REPO_ROOT / config_path, {})
            assert config.ledger_url.startswith("postgresql")
            assert (config.p2p.host, config.p2p.public_host) == ("0.0.0.0", "coordinator")
        if name in {"worker", "validator"}:
            assert context.params["coordinator"].startswith("http://coordinator:")
    worker = parse_command(services["worker"]["command"])
    assert worker.params["gpu"] == "all"


def test_a_wrong_flag_is_caught() -> None:
    with pytest.raises(Exception, match="No such option: --gpus"):
        parse_command(["prime-worker", "join", "--gpus", "all"])
