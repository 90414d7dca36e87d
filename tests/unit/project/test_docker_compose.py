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
import yaml

from tests.support.cli_parse import parse_command

REPO_ROOT = Path(__file__).resolve().parents[3]
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


def test_compose_file_is_valid_and_has_every_role() -> None:
    services = compose_config()["services"]
    assert ROLE_SERVICES | {"postgres"} <= set(services)
    assert "postgresql" in services["coordinator"]["environment"]["PRIME_COORDINATOR_LEDGER__URL"]
    assert services["coordinator"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device["capabilities"] for device in devices)


def test_every_service_runs_a_command_our_cli_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.config import CoordinatorConfig
    from runtime.config import load_config

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
