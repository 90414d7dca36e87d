"""A person's first mistakes, through the real console scripts: one line naming the problem and the fix.

Each case runs a role's command as a subprocess against real things (a PostgreSQL server whose
role does not exist, a port another socket holds, a plain web server where a coordinator or a
relay should be, a coordinator URL nothing listens on, a module path that shadows vLLM with
one that cannot be imported) and checks the exit code, that stderr has exactly one ``error:``
line holding the expected words, and that no traceback is shown unless ``--log-level debug``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.identity import load_or_create_identity
from runtime.children import stop_processes
from runtime.cli import EXIT_BAD_CONFIG, EXIT_FAILURE
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import BIN, REPO_ROOT
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PRIME_LOG_LEVEL": "info"}


def run(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 120) -> tuple[int, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env or ENV, cwd=REPO_ROOT)
    return done.returncode, done.stderr


def error_lines(stderr: str) -> list[str]:
    """The lines a command stopped with, as ``error: ...``: plain ones, and under --json-logs the one JSON
    object of logger ``exit`` (its event is the same line)."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("error:"):
            found.append(line)
        elif line.startswith("{") and json.loads(line).get("logger") == "exit":
            found.append(f"error: {json.loads(line)['event']}")
    return found


def error_line(stderr: str) -> str:
    """The one error line of ``stderr`` (failing if there are none or several, or a traceback)."""
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def expect(argv: list[str], code: int, *words: str, env: dict[str, str] | None = None) -> str:
    returncode, stderr = run(argv, env)
    line = error_line(stderr)
    assert returncode == code, stderr[-3000:]
    for word in words:
        assert word in line, line
    return line


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[str]:
    """A plain HTTP server (python -m http.server): answers, but is neither a coordinator nor a relay."""
    port = free_port()
    (tmp_path / "www").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(tmp_path / "www")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(answers, 30, "the web server to listen")
        yield url
    finally:
        stop_processes([proc])


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def coordinator_argv(tmp_path: Path, *extra: str) -> list[str]:
    argv = [str(BIN / "prime-coordinator"), "start", "--data-dir", str(tmp_path / "run"), "--port", "0"]
    return [*argv, "--set", "p2p.enabled=false", *extra]


def worker_argv(tmp_path: Path, coordinator: str, *extra: str) -> list[str]:
    argv = [str(BIN / "prime-worker"), "join", "--coordinator", coordinator, "--engine", "hf", "--gpu", "none"]
    return [*argv, "--data-dir", str(tmp_path / "worker"), "--json-logs", "--no-p2p", *extra]


# --- the coordinator --------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_coordinator_on_a_postgres_role_that_does_not_exist(tmp_path: Path, postgres_url: str) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url).set(username="no_such_role_here", password=None).render_as_string(False)
    expect(
        coordinator_argv(tmp_path, "--ledger-url", url),
        EXIT_FAILURE,
        "cannot open the ledger database",
        'role "no_such_role_here" does not exist',
        "createuser",
    )


def test_coordinator_on_a_sqlite_file_it_cannot_create(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    url = f"sqlite:///{tmp_path / 'a-file' / 'ledger.db'}"
    expect(coordinator_argv(tmp_path, "--ledger-url", url), EXIT_FAILURE, "cannot create the ledger database")


def test_coordinator_on_a_port_in_use(tmp_path: Path, busy_port: int) -> None:
    argv = coordinator_argv(tmp_path)
    argv[argv.index("--port") + 1] = str(busy_port)
    expect(argv, EXIT_FAILURE, f"cannot listen on 127.0.0.1:{busy_port}", "already in use", "--port")


def test_coordinator_with_a_missing_start_checkpoint(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    argv = coordinator_argv(tmp_path, "--set", f"policy.start_checkpoint='{missing}'")
    expect(argv, EXIT_BAD_CONFIG, str(missing), "does not exist", "builtin:")


def test_coordinator_with_an_environment_package_not_installed(tmp_path: Path) -> None:
    argv = coordinator_argv(tmp_path, "--set", 'environment={type="python", target="no_such_environment:Tasks"}')
    expect(argv, EXIT_BAD_CONFIG, "no_such_environment", "install its module")


def test_coordinator_with_a_precision_its_validators_have_no_calibration_for(tmp_path: Path) -> None:
    expect(
        coordinator_argv(tmp_path, "--set", "precision='float16'"),
        EXIT_BAD_CONFIG,
        "precision float16",
        "no TOPLOC calibration",
        "python -m bench.toploc_calibrate --dtype float16 --engine hf --write",
    )
    assert not (tmp_path / "run").exists(), "refused before anything of the run was created"


@pytest.mark.parametrize(
    ("assignment", "words"),
    [
        ("api.prot=1", ("api.prot", "unknown key")),
        ("scheduling.group_size=0", ("scheduling.group_size",)),
        ("scheduling=3", ("scheduling",)),
    ],
)
def test_coordinator_with_a_wrong_config_key_or_value(tmp_path: Path, assignment: str, words: tuple[str, ...]) -> None:
    expect(coordinator_argv(tmp_path, "--set", assignment), EXIT_BAD_CONFIG, *words)


def test_a_config_file_with_a_wrong_key_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[orchestrator]\nnum_step = 3\n")
    expect(
        [str(BIN / "prime-coordinator"), "start", "-c", str(path)], EXIT_BAD_CONFIG, "orchestrator.num_step", "run.toml"
    )


# --- workers and validators: the coordinator and relay URLs -----------------------------------------------


def test_worker_with_a_coordinator_url_nothing_listens_on(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = worker_argv(tmp_path, url, "--set", "first_contact_timeout_s=1")
    expect(argv, EXIT_FAILURE, f"cannot reach the coordinator at {url}", "--coordinator")


def test_worker_with_a_url_that_is_not_a_coordinator(tmp_path: Path, web_server: str) -> None:
    expect(worker_argv(tmp_path, web_server), EXIT_FAILURE, f"{web_server} is not a prime-network coordinator", "404")


def test_validator_with_a_url_that_is_not_a_coordinator(tmp_path: Path, web_server: str) -> None:
    argv = [str(BIN / "prime-validator"), "run", "--coordinator", web_server, "--data-dir", str(tmp_path / "v")]
    expect([*argv, "--json-logs", "--no-p2p"], EXIT_FAILURE, "is not a prime-network coordinator")


def test_worker_and_validator_with_a_relay_url_that_is_not_a_relay(tmp_path: Path, web_server: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "run.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "run"}"\n[api]\nhost = "127.0.0.1"\nport = {port}\n[p2p]\nenabled = false\n'
    )
    coordinator = CoordinatorProcess(config, tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    try:
        coordinator.start(url, timeout_s=120)
        expect(worker_argv(tmp_path, url, "--relay", web_server), EXIT_FAILURE, "is not a SHARDCAST relay", "--relay")
        validator = [str(BIN / "prime-validator"), "run", "--coordinator", url, "--data-dir", str(tmp_path / "v")]
        validator += ["--json-logs", "--no-p2p", "--set", f"relays=['{web_server}']"]
        expect(validator, EXIT_FAILURE, f"{web_server} is not a SHARDCAST relay")
    finally:
        coordinator.stop()


def test_the_traceback_is_shown_with_log_level_debug_only(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = worker_argv(tmp_path, url, "--set", "first_contact_timeout_s=0")
    code, stderr = run([*argv, "--log-level", "debug"])
    assert code == EXIT_FAILURE
    assert "Traceback" in stderr and "StartupError" in stderr
    assert error_lines(stderr)[-1].startswith("error: cannot reach the coordinator")


# --- a missing optional dependency, the relay, the trainer --------------------------------------------------


def test_worker_with_the_vllm_engine_when_vllm_cannot_be_imported(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    (shadow / "vllm").mkdir(parents=True)  # found before the installed vLLM, and failing the way a missing one does
    (shadow / "vllm" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n")
    env = {**ENV, "PYTHONPATH": f"{shadow}{os.pathsep}{REPO_ROOT}"}
    argv = worker_argv(tmp_path, "http://127.0.0.1:9")
    argv[argv.index("hf")] = "vllm"
    expect(argv, EXIT_FAILURE, "--engine vllm needs vLLM", "pip install", "--engine hf", env=env)


def test_relay_with_an_upstream_that_is_not_a_relay(tmp_path: Path, web_server: str) -> None:
    coordinator_id = load_or_create_identity(tmp_path / "coordinator").node_id
    argv = [str(BIN / "prime-relay"), "serve", "--upstream", web_server, "--coordinator-id", coordinator_id]
    argv += ["--data-dir", str(tmp_path / "relay"), "--port", "0", "--no-p2p"]
    expect(argv, EXIT_FAILURE, f"{web_server} is not a SHARDCAST relay")


def test_relay_on_a_port_in_use(tmp_path: Path, busy_port: int) -> None:
    coordinator_id = load_or_create_identity(tmp_path / "coordinator").node_id
    upstream = f"http://127.0.0.1:{free_port()}/shardcast"  # not up yet: only a warning
    argv = [str(BIN / "prime-relay"), "serve", "--upstream", upstream, "--coordinator-id", coordinator_id]
    argv += ["--data-dir", str(tmp_path / "relay"), "--port", str(busy_port), "--no-p2p"]
    expect(argv, EXIT_FAILURE, f"cannot listen on 127.0.0.1:{busy_port}", "--port")


def test_trainer_with_a_missing_model(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    argv = [str(BIN / "prime-trainer"), "eval", "--model", str(missing), "--num-examples", "1"]
    expect(argv, EXIT_BAD_CONFIG, str(missing), "does not exist")


def test_trainer_rl_with_a_missing_model(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    argv = [str(BIN / "prime-trainer"), "rl", "--set", f"trainer.model='{missing}'", "--output-dir", str(tmp_path)]
    expect(argv, EXIT_BAD_CONFIG, str(missing), "does not exist")
