"""A real network on 127.0.0.1 for integration tests: a coordinator process, relays, workers and validators.

:func:`running_network` starts `prime-coordinator start` on a free port with two tiny policy
checkpoints (v0 published at start, v1 ready for :meth:`Network.publish`) unless given its own;
the ``network`` fixture in ``tests/integration/conftest.py`` wraps it; the
:class:`Network` starts `prime-worker join` and `prime-validator run` processes, reads the
event log, and stops every process it started (by PID) on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import tomli_w
from sqlalchemy import Executable, create_engine, text

from runtime.children import stop_processes
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.shardcast_nodes import Nodes, wait_until
from tests.support.tiny_model import TinyModelSpec, save_tiny_qwen2

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# head_dim 32 (vLLM's CPU attention needs 32 and up); 16 KiB shards so a version has many.
SPEC = TinyModelSpec(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
REVERSE_TEXT: dict[str, Any] = {"type": "builtin", "name": "reverse_text"}
"""The default [environment] of test runs."""


@dataclass
class Network:
    url: str
    root: Path
    config_path: Path
    coordinator: CoordinatorProcess
    coordinator_id: str
    checkpoints: list[Path]
    relays: Nodes
    workers: list[subprocess.Popen[bytes]]
    pythonpath: str = str(REPO_ROOT)
    """PYTHONPATH of every process of the run (the repository, and where the run's environment lives)."""

    def start_worker(
        self, name: str, engine: str, relays: list[str], *extra: str, json_logs: bool = True
    ) -> subprocess.Popen[bytes]:
        """A `prime-worker join` logging to ``root/name.log`` (stdout and stderr), with JSON lines unless told."""
        argv = [str(BIN / "prime-worker"), "join", "--coordinator", self.url, "--engine", engine, "--gpu", "none"]
        argv += ["--data-dir", str(self.root / name), *(["--json-logs"] if json_logs else []), *extra]
        argv += [item for relay in relays for item in ("--relay", relay)]
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        env = {**os.environ, "PYTHONPATH": self.pythonpath}
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self.workers.append(proc)
        return proc

    def start_validator(
        self, name: str = "validator", *extra: str, pythonpath: str | None = None, json_logs: bool = True
    ) -> subprocess.Popen[bytes]:
        """A `prime-validator run` (``extra`` arguments appended; ``pythonpath`` instead of the run's; human log
        lines, as an operator's console shows them, without ``json_logs``)."""
        argv = [
            str(BIN / "prime-validator"),
            "run",
            "--coordinator",
            self.url,
            "--data-dir",
            str(self.root / name),
            *extra,
        ]
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        env = {**os.environ, "PYTHONPATH": pythonpath or self.pythonpath}
        proc = subprocess.Popen([*argv, *(["--json-logs"] if json_logs else [])], stdout=log, stderr=log, env=env)
        self.workers.append(proc)
        return proc

    def publish(self, version: int) -> None:
        argv = [str(BIN / "prime-coordinator"), "publish", str(self.checkpoints[version]), "-c", str(self.config_path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            page = httpx.get(f"{self.url}/v1/events", params={"after": after, "limit": 1000}, timeout=5).json()
            found += [e for e in page["events"] if kind is None or e["kind"] == kind]
            if not page["events"]:
                return found
            after = page["next_after"]

    def verdicts(self) -> dict[str, dict[str, Any]]:
        """Each decided submission's verdict event data (accepted, reasons, worker_id, ...), by submission id."""
        return {event["subject"]: event["data"] for event in self.events("verdict")}

    def expect_verdicts(
        self, judged: dict[str, str], rejected_by: dict[str, str], control: str = "honest_control"
    ) -> None:
        """Wait for a verdict on each of ``judged`` (name -> submission id): ``control`` accepted, every name of
        ``rejected_by`` rejected with a reason that holds its text."""
        wait_until(lambda: set(judged.values()) <= set(self.verdicts()), 300, "verdicts on every submission")
        verdicts = self.verdicts()
        assert verdicts[judged[control]]["accepted"], verdicts[judged[control]]["reasons"]
        for name, expected in rejected_by.items():
            verdict = verdicts[judged[name]]
            assert not verdict["accepted"], (name, verdict)
            assert any(expected in reason for reason in verdict["reasons"]), (name, verdict["reasons"])

    def worker_log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]


def tiny_policy(path: Path, seed: int, spec: TinyModelSpec = SPEC) -> Path:
    """A random tiny Qwen2 (:data:`SPEC` unless given) with the built-in tokenizer, so environments' prompts encode."""
    from trainer.resolve import resolve_model_path

    save_tiny_qwen2(path, seed=seed, spec=spec)
    tokenizer_dir = resolve_model_path("builtin:tiny-qwen2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, path / name)
    return path


@contextmanager
def running_network(
    tmp_path: Path,
    checkpoints: list[Path] | None = None,
    environment: dict[str, Any] | None = None,
    pythonpath: Sequence[Path] = (),
    sections: dict[str, dict[str, Any]] | None = None,
    start_timeout_s: float = 120,
    precision: str | None = None,
) -> Iterator[Network]:
    """Coordinator (2 prompts x 4 samples, 48 tokens, async level 1, open validators) on a free port,
    serving ``environment`` (default: the built-in reverse_text) with ``checkpoints[0]`` published as policy
    v0; ``sections`` update the config's sections (e.g. ``trust={"ban_after_rejections": 5}``); ``pythonpath``
    adds directories to every process's PYTHONPATH (where a test's environment module lives); ``precision``
    sets the run's (default: the coordinator's `auto`)."""
    if checkpoints is None:
        checkpoints = [tiny_policy(tmp_path / f"policy-{v}", seed=v) for v in range(2)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config: dict[str, Any] = {
        "run_name": "workers",
        "data_dir": str(tmp_path / "run"),
        "environment": environment or REVERSE_TEXT,
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 100000, "ip_burst": 100000},
        "scheduling": {"prompts_per_task": 2, "group_size": 4, "max_tokens": 48, "lease_ttl_s": 8, "async_level": 1},
        "trust": {"validators_open": True},
        "sources": {"allow": ["127.0.0.0/8"]},  # every node runs here: trusted, as in configs/demo.toml
        "policy": {"start_checkpoint": str(checkpoints[0]), "shard_size_bytes": 16384},
    }
    for name, values in (sections or {}).items():
        config[name] = {**config.get(name, {}), **values}
    if precision is not None:
        config["precision"] = precision
    config_path = tmp_path / "run.toml"
    config_path.write_text(tomli_w.dumps(config))
    path = os.pathsep.join([str(REPO_ROOT), *map(str, pythonpath)])
    coordinator = CoordinatorProcess(config_path, tmp_path / "coordinator.log", {"PYTHONPATH": path})
    relays = Nodes(tmp_path)
    net = Network(url, tmp_path, config_path, coordinator, "", checkpoints, relays, [], path)
    try:
        coordinator.start(url, timeout_s=start_timeout_s)
        net.coordinator_id = httpx.get(f"{url}/v1/policy-versions/latest", timeout=5).json()["signer"]
        yield net
    finally:
        stop_processes(net.workers)
        relays.stop_all()
        coordinator.stop()


def ledger_rows(root: Path, statement: str | Executable) -> list[Any]:
    """The rows of ``statement`` (SQL text or a SQLAlchemy statement) on the SQLite ledger of the run whose
    data dir is ``root / "run"`` (as :func:`running_network` and the orchestrator tests lay it out)."""
    engine = create_engine(f"sqlite:///{root / 'run' / 'ledger.db'}")
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(statement) if isinstance(statement, str) else statement).all())
    finally:
        engine.dispose()


def submissions_by_node(net: Network) -> dict[str, list[dict[str, Any]]]:
    by_node: dict[str, list[dict[str, Any]]] = {}
    for event in net.events("submit"):
        by_node.setdefault(event["node_id"], []).append(event)
    return by_node


def train_through_local_network(
    tmp_path: Path,
    run_name: str,
    environment: dict[str, Any],
    start_checkpoint: str,
    num_steps: int,
    max_tokens: int,
    pythonpath: Sequence[Path] = (),
    while_running: Callable[[str], None] | None = None,
) -> None:
    """`prime-coordinator start` of a small RL run (2 prompts x 4 samples a task, one task a step, async level 1)
    with its local network (an HF worker, a validator, a one-rank trainer) to its end, in ``tmp_path / "run"``;
    ``while_running(url)`` is called once the API answers. Fails with the coordinator's log unless it exits 0.
    The tiny policies seldom get one of a group's samples right where another fails: every step trains, signal
    or not (``no_signal_filter`` off), so each shows the trainer's figures. At this learning rate one step moves
    them far: up to a sixth of an older version's tokens fall outside the ratio band, honestly, so that breaker
    is set wider."""
    port = free_port()
    config = {
        "run_name": run_name,
        "data_dir": str(tmp_path / "run"),
        "environment": environment,
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {
            "async_level": 1,
            "prompts_per_task": 2,
            "group_size": 4,
            "max_tokens": max_tokens,
            "lease_ttl_s": 60,
        },
        "trust": {"validators_open": True},
        "policy": {"start_checkpoint": start_checkpoint, "shard_size_bytes": 1 << 20},
        "orchestrator": {
            "enabled": True,
            "num_steps": num_steps,
            "groups_per_step": 1,
            "trainer_launch": {"nproc": 1},
            "progress_interval_s": 2,
            "no_signal_filter": False,
            "breakers": {"max_out_of_band_fraction": 0.5},
        },
        "local_network": {"enabled": True, "engines": ["hf"], "num_validators": 1},
    }
    config_path = tmp_path / "run.toml"
    config_path.write_text(tomli_w.dumps(config))
    path = os.pathsep.join([str(REPO_ROOT), *map(str, pythonpath)])
    coordinator = CoordinatorProcess(
        config_path, tmp_path / "coordinator.log", {"PYTHONPATH": path}, stdout_path=tmp_path / "coordinator.out"
    )
    url = f"http://127.0.0.1:{port}"
    coordinator.start(url, timeout_s=300)
    try:
        if while_running is not None:
            while_running(url)
        assert coordinator.proc is not None
        rc = coordinator.proc.wait(timeout=600)
    finally:
        coordinator.stop()
    assert rc == 0, (tmp_path / "coordinator.log").read_text()[-4000:]
