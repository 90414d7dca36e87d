"""Multi-node trainer launch: `[orchestrator.trainer_launch]` checked at start-up, each node's torchrun command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.config import CoordinatorConfig
from coordinator.processes.trainer_process import TrainerProcess, trainer_node
from protocol.errors import ConfigError
from runtime.config import load_config
from trainer.config import LossConfig, TrainerSection
from trainer.launch import TrainerNode, check_train_dir, torchrun_command
from trainer.service import ServiceSpec, write_spec
from trainer.transport import TrainDir


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def _coordinator_config(tmp_path: Path, launch: str, orchestrator: str = "") -> CoordinatorConfig:
    path = tmp_path / "run.toml"
    path.write_text(f"[orchestrator]\nenabled = true\n{orchestrator}\n[orchestrator.trainer_launch]\n{launch}\n")
    return load_config(CoordinatorConfig, path)


def test_one_node_by_default_binds_its_own_free_port(tmp_path: Path) -> None:
    """torchrun --standalone binds port 0 itself: no port is chosen here that another process could take first."""
    config = _coordinator_config(tmp_path, "nproc = 2")
    process = TrainerProcess(TrainDir(tmp_path / "train"), _spec(), 2, node=trainer_node(config))
    command = process.command()
    assert command[command.index("-m") + 1] in ("trainer.service", "torch.distributed.run")
    assert _flag(command, "--nnodes") == "1" and _flag(command, "--node-rank") == "0"
    assert _flag(command, "--nproc-per-node") == "2" and "--standalone" in command
    assert "--master-port" not in command and "--master-addr" not in command
    assert _flag(command, "--coordinator-pid") == str(os.getpid())
    assert _flag(command, "--train-dir") == str(tmp_path / "train")


def test_several_nodes_without_a_fixed_port_are_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"set orchestrator\.trainer_launch\.master_port") as raised:
        _coordinator_config(tmp_path, "nnodes = 2")
    assert "fixed port" in raised.value.message and str(tmp_path / "run.toml") in raised.value.message
    assert "\n" not in raised.value.message and "{" not in raised.value.message  # one line, no table echoed


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("trainer_nproc = 4", "nproc"),
        ("trainer_cpus = [0]", "cpus"),
        ("trainer_nnodes = 2", "nnodes"),
        ('trainer_master_addr = "10.0.0.5"', "master_addr"),
        ("trainer_master_port = 29500", "master_port"),
    ],
)
def test_the_flat_trainer_keys_name_their_new_place(tmp_path: Path, old: str, new: str) -> None:
    key = old.split(" ")[0]
    with pytest.raises(ConfigError, match=rf"orchestrator\.{key} moved: set orchestrator\.trainer_launch\.{new}\b"):
        _coordinator_config(tmp_path, "", orchestrator=old)
    with pytest.raises(ConfigError, match=rf"orchestrator\.{key} moved"):
        load_config(CoordinatorConfig, None, {f"orchestrator.{key}": old.split(" = ")[1].strip('"')})


def test_a_flat_trainer_key_from_the_environment_is_named_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_COORDINATOR_ORCHESTRATOR__TRAINER_NPROC", "4")
    with pytest.raises(
        ConfigError, match=r"orchestrator\.trainer_nproc moved: set orchestrator\.trainer_launch\.nproc"
    ):
        load_config(CoordinatorConfig)


def test_node_zero_of_several_dials_the_configured_rendezvous(tmp_path: Path) -> None:
    config = _coordinator_config(tmp_path, 'nproc = 4\nnnodes = 3\nmaster_addr = "10.0.0.5"\nmaster_port = 29500')
    command = TrainerProcess(TrainDir(tmp_path / "train"), _spec(), 4, node=trainer_node(config)).command()
    assert _flag(command, "--nnodes") == "3" and _flag(command, "--node-rank") == "0"
    assert _flag(command, "--nproc-per-node") == "4"
    assert _flag(command, "--master-addr") == "10.0.0.5" and _flag(command, "--master-port") == "29500"
    assert _flag(command, "--coordinator-pid") == str(os.getpid())


def test_other_nodes_have_no_coordinator_pid(tmp_path: Path) -> None:
    node = TrainerNode(nproc_per_node=1, nnodes=2, node_rank=1, master_addr="10.0.0.5", master_port=29500)
    command = torchrun_command(tmp_path, node, coordinator_pid=None)
    assert "--coordinator-pid" not in command
    assert _flag(command, "--node-rank") == "1" and _flag(command, "--master-port") == "29500"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nnodes": 2, "node_rank": 2, "master_port": 29500}, "outside 0..1"),
        ({"nnodes": 2, "node_rank": 1, "master_port": 0}, "fixed master port"),
        ({"nnodes": 1, "master_addr": ""}, "master address"),
        ({"nnodes": 1, "master_port": 70000}, "not a TCP port"),
    ],
)
def test_bad_node_placements_are_refused(fields: dict[str, int | str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainerNode(nproc_per_node=1, **fields)  # type: ignore[arg-type]


def _spec() -> ServiceSpec:
    return ServiceSpec(trainer=TrainerSection(), loss=LossConfig(), num_steps=1)


def test_a_node_needs_the_shared_train_dir_and_its_spec(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist on this machine.*shared"):
        check_train_dir(tmp_path / "missing")
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match="start the coordinator first"):
        check_train_dir(tmp_path / "train")
    write_spec(TrainDir(tmp_path / "train"), _spec())
    assert check_train_dir(tmp_path / "train") == tmp_path / "train" / "service.json"


def test_node_command_explains_a_missing_train_dir(tmp_path: Path) -> None:
    from trainer.cli import app

    args = ["node", "--train-dir", str(tmp_path / "nowhere"), "--nnodes", "2", "--node-rank", "1"]
    result = CliRunner().invoke(app, [*args, "--master-addr", "10.0.0.5", "--master-port", "29500"])
    output = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code != 0
    assert "does not exist on this machine" in output and "shared" in output
    (tmp_path / "train").mkdir()
    args[2] = str(tmp_path / "train")
    result = CliRunner().invoke(app, [*args, "--master-addr", "10.0.0.5", "--master-port", "29500"])
    assert result.exit_code != 0 and "start the coordinator first" in " ".join(result.output.split())


def test_several_nodes_share_the_start_checkpoint_through_the_train_dir(tmp_path: Path) -> None:
    source = tmp_path / "start"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    spec = ServiceSpec(trainer=TrainerSection(model=str(source)), loss=LossConfig(), num_steps=1)
    node = TrainerNode(nproc_per_node=1, nnodes=2, master_port=29500)
    process = TrainerProcess(TrainDir(tmp_path / "train"), spec, 1, node=node)
    process._share_start_checkpoint()
    shared = (tmp_path / "train" / "start_checkpoint").resolve()
    assert process.spec.trainer.model == str(shared)
    assert (shared / "model.safetensors").read_bytes() == b"weights"
