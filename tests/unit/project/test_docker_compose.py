"""docker-compose.yml: valid for Compose, one service per role, each running a real command of ours.

`docker-compose config` (Debian's docker-compose package; .ci/run installs it) validates and
normalises the file. Every service's command is then parsed by the same typer CLI a person
runs, so a renamed flag or subcommand breaks this test instead of the deployment; the config
files the commands name are loaded with their role's config model.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from protocol.identity import NodeIdentity
from tests.support.cli_parse import parse_command
from tests.support.requirements import missing

REPO_ROOT = Path(__file__).resolve().parents[3]
ROLE_SERVICES = {"coordinator", "relay", "worker", "validator"}


def compose_config() -> dict[str, Any]:
    binary = shutil.which("docker-compose")
    if binary is None:
        missing(
            "docker-compose is not installed (.ci/run installs Debian's docker-compose)",
            "docker-compose is not installed here (apt-get install docker-compose)",
        )
    done = subprocess.run(
        [binary, "-f", str(REPO_ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


LONG_RUNNING = ROLE_SERVICES | {"postgres"}
IDS = {"/ids/coordinator": NodeIdentity.generate().node_id, "/ids/validator": NodeIdentity.generate().node_id}


def role_argv(command: list[str]) -> list[str]:
    """A service's command as the role's argv: a `sh -c 'exec prime-...'` wrapper unwrapped, and the ids it reads
    from the ids volume (`$(cat /ids/NAME)`) replaced by node ids."""
    if command[:2] != ["sh", "-c"]:
        return command
    script = command[2].replace("$$", "$")
    for path, node_id in IDS.items():
        script = script.replace(f"$(cat {path})", node_id)
    argv = shlex.split(script)
    assert argv[0] == "exec", f"a wrapped command must exec the role (signals reach it): {script}"
    return argv[1:]


def test_compose_file_is_valid_and_has_every_role() -> None:
    services = compose_config()["services"]
    assert ROLE_SERVICES | {"postgres", "keys"} <= set(services)
    assert "postgresql" in services["coordinator"]["environment"]["PRIME_COORDINATOR_LEDGER__URL"]
    assert services["coordinator"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device["capabilities"] for device in devices)


def test_long_running_services_restart_and_only_the_worker_asks_a_gpu() -> None:
    services = compose_config()["services"]
    for name in LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name
    assert services["keys"].get("restart") == "no"
    for name in ("coordinator", "relay", "validator", "keys"):
        assert "deploy" not in services[name], f"{name} asks for a device it does not use"
        assert "EXTRAS" not in (services[name]["build"].get("args") or {}), f"{name} builds the GPU image"


def test_ids_are_wired_by_the_keys_service_not_by_hand(tmp_path: Path) -> None:
    """The keys service's script, run for real (its paths moved under tmp), makes the keys and writes the ids the
    relay pins and the coordinator approves; no service needs an id from the environment."""
    services = compose_config()["services"]
    for name in ("coordinator", "relay", "validator"):
        assert services[name]["depends_on"]["keys"]["condition"] == "service_completed_successfully", name
    assert "PRIME_RELAY_COORDINATOR_ID" not in (services["relay"].get("environment") or {})
    script = services["keys"]["command"][2].replace("$$", "$").replace("/ids/", f"{tmp_path}/ids/")
    (tmp_path / "ids").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "configs").symlink_to(REPO_ROOT / "configs")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    for attempt in range(2):  # a second run (a restarted stack) keeps the keys and writes the same ids
        done = subprocess.run(["sh", "-c", script], cwd=tmp_path / "app", env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        ids = {name: (tmp_path / "ids" / name).read_text().strip() for name in ("coordinator", "validator")}
        if attempt == 0:
            first = ids
    assert ids == first and all(value.startswith("12D3KooW") for value in ids.values())
    assert "--coordinator-id" in role_argv(services["relay"]["command"])
    coordinator = parse_command(role_argv(services["coordinator"]["command"]))
    assert any(IDS["/ids/validator"] in value for value in coordinator.params["sets"])


def test_every_service_runs_a_command_our_cli_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.config import CoordinatorConfig
    from runtime.cli import load_role_config

    services = compose_config()["services"]
    for name, value in services["coordinator"]["environment"].items():
        monkeypatch.setenv(name, str(value))
    for name in sorted(ROLE_SERVICES):
        argv = role_argv(services[name]["command"])
        context = parse_command(argv)
        config_path = context.params.get("config")
        if config_path is not None and name == "coordinator":  # the file, the environment and --set all apply
            config = load_role_config(CoordinatorConfig, REPO_ROOT / config_path, context.params["sets"])
            assert config.ledger_url.startswith("postgresql")
            assert (config.p2p.host, config.p2p.public_host) == ("0.0.0.0", "coordinator")
            assert config.orchestrator.enabled, "the compose network must train"
            assert IDS["/ids/validator"] in config.trust.approved_validators
        if name in {"worker", "validator"}:
            assert context.params["coordinator"].startswith("http://coordinator:")
    worker = parse_command(services["worker"]["command"])
    assert worker.params["gpu"] == "all"


def test_a_wrong_flag_is_caught() -> None:
    with pytest.raises(Exception, match="No such option: --gpus"):
        parse_command(["prime-worker", "join", "--gpus", "all"])
