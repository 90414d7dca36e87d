"""Configs: every shipped TOML parses; unknown keys and bad values are named with their file."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig
from protocol.errors import ConfigError
from runtime.config import RoleConfig, load_config, parse_assignment
from shardcast.relay.config import RelayConfig
from trainer.config import EvalConfig, RlConfig, SftConfig
from validator.config import ValidatorConfig
from worker.config import WorkerConfig

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "configs"
# Which config class reads a shipped file, by the file name's first word.
KIND_BY_PREFIX: dict[str, type[RoleConfig]] = {
    "coordinator": CoordinatorConfig,
    "demo": CoordinatorConfig,
    "worker": WorkerConfig,
    "validator": ValidatorConfig,
    "relay": RelayConfig,
    "sft": SftConfig,
    "rl": RlConfig,
    "eval": EvalConfig,
}


def _kind(path: Path) -> type[RoleConfig]:
    prefix = path.stem.split("_")[0].split("-")[0]
    assert prefix in KIND_BY_PREFIX, f"{path.name}: no config class for prefix {prefix!r}; add it to KIND_BY_PREFIX"
    return KIND_BY_PREFIX[prefix]


SHIPPED = sorted(CONFIGS_DIR.glob("*.toml"))


def test_configs_are_shipped() -> None:
    assert len(SHIPPED) >= 6


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_parses(path: Path) -> None:
    config = load_config(_kind(path), path)
    assert config.model_dump()


def test_unknown_key_is_named_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('run_name = "x"\n[api]\nprot = 8000\n')
    with pytest.raises(ConfigError) as info:
        load_config(CoordinatorConfig, path)
    assert "api.prot" in info.value.message
    assert str(path) in info.value.message
    assert "unknown key" in info.value.message


def test_unknown_top_level_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('coordinater_url = "http://x"\n')
    with pytest.raises(ConfigError, match="coordinater_url"):
        load_config(WorkerConfig, path)


def test_bad_value_is_named(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[scheduling]\nasync_level = -1\n")
    with pytest.raises(ConfigError, match=r"scheduling\.async_level"):
        load_config(CoordinatorConfig, path)


def test_invalid_toml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[api\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(CoordinatorConfig, path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(CoordinatorConfig, tmp_path / "nope.toml")


def test_precedence_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.toml"
    path.write_text('run_name = "from-file"\n[api]\nport = 1111\nhost = "10.0.0.1"\n')
    config = load_config(CoordinatorConfig, path)
    assert (config.run_name, config.api.port, config.api.host) == ("from-file", 1111, "10.0.0.1")

    monkeypatch.setenv("PRIME_COORDINATOR_API__PORT", "2222")
    config = load_config(CoordinatorConfig, path)
    assert (config.api.port, config.api.host) == (2222, "10.0.0.1")

    config = load_config(CoordinatorConfig, path, {"api.port": 3333, "run_name": None})
    assert (config.api.port, config.run_name) == (3333, "from-file")


def test_bad_env_value_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_WORKER_MAX_BATCH_SIZE", "lots")
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_config(WorkerConfig)


def test_cross_field_rule_runs_at_start_up() -> None:
    with pytest.raises(ConfigError, match=r"ledger\.url"):
        load_config(CoordinatorConfig, None, {"ledger.url": "mysql://x"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("api.port=8001", ("api.port", 8001)), ("run_name=abc", ("run_name", "abc")), ("x=[1, 2]", ("x", [1, 2]))],
)
def test_set_assignments(text: str, expected: tuple[str, object]) -> None:
    assert parse_assignment(text) == expected


def test_set_without_equals_is_refused() -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignment("api.port")


def test_worker_gpu_selection_is_validated() -> None:
    assert load_config(WorkerConfig, None, {"gpu": "0,1"}).gpu == "0,1"
    with pytest.raises(ConfigError, match="gpu"):
        load_config(WorkerConfig, None, {"gpu": "first"})


def test_the_coordinator_defaults_to_an_operator_run_dir_and_the_demo_names_its_own() -> None:
    from typer.main import get_command

    from coordinator.cli import app

    default = CoordinatorConfig.model_fields["data_dir"].default
    assert default == Path("runs/coordinator")
    assert load_config(CoordinatorConfig, CONFIGS_DIR / "demo.toml").data_dir == Path("runs/demo")
    keys = get_command(app).commands["keys"].commands["show"]  # type: ignore[attr-defined]
    # no default of its own: without --data-dir, keys show reads data_dir from the config
    assert next(p.default for p in keys.params if p.name == "data_dir") is None


def test_the_validator_refuses_an_engine_it_would_not_run() -> None:
    assert load_config(ValidatorConfig).engine == "hf"
    with pytest.raises(ConfigError, match=r"key 'engine'"):
        load_config(ValidatorConfig, None, {"engine": "vllm"})


def test_a_misspelt_environment_variable_is_refused_with_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_WORKER_GPUS", "all")
    with pytest.raises(ConfigError, match=r"PRIME_WORKER_GPUS names no setting.*did you mean PRIME_WORKER_GPU"):
        load_config(WorkerConfig)


def test_environment_variables_of_a_sibling_trainer_command_are_not_typos(monkeypatch: pytest.MonkeyPatch) -> None:
    # sft, rl and eval share PRIME_TRAINER_: a setting of one is no typo when another command runs
    assert "num_steps" in RlConfig.model_fields and "num_steps" not in EvalConfig.model_fields
    monkeypatch.setenv("PRIME_TRAINER_NUM_STEPS", "3")
    monkeypatch.setenv("PRIME_TRAINER_FAILPOINT", "batch:1")
    load_config(EvalConfig)
    monkeypatch.setenv("PRIME_TRAINER_NUM_STEP", "3")
    with pytest.raises(ConfigError, match="PRIME_TRAINER_NUM_STEP names no setting"):
        load_config(EvalConfig)


def test_a_run_has_one_model_setting() -> None:
    config = load_config(CoordinatorConfig, None, {"policy.start_checkpoint": "Qwen/Qwen3-0.6B"})
    assert config.orchestrator.trainer.model == "Qwen/Qwen3-0.6B"  # what `config show` prints is what is trained
    with pytest.raises(ConfigError, match=r"orchestrator.trainer.model .* set policy.start_checkpoint instead"):
        load_config(CoordinatorConfig, None, {"orchestrator.trainer.model": "/data/my-qwen3-8b"})
    # a resolved config written back (config show > run.toml) reads back the same
    both = {"policy.start_checkpoint": "Qwen/Qwen3-0.6B", "orchestrator.trainer.model": "Qwen/Qwen3-0.6B"}
    assert load_config(CoordinatorConfig, None, both).orchestrator.trainer.model == "Qwen/Qwen3-0.6B"
