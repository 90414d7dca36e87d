"""The training-safety contract through the real network: poisoned batches refused, rollbacks by rule and by hand.

- A colluding quorum (two validators that accept everything) and a worker that submits random tokens, which the
  colluders reward: every batch that holds them is refused by the trainer's own replay of the draws, the worker is
  caught and banned, and no applied step ever trained one of its samples (bench/poisoned_update.py's poisoned run,
  shortened).
- `prime-coordinator rollback --to v1` on a live run with vLLM and HF workers behind a relay, the coordinator
  SIGKILLed once the rollback's step is recorded and started again: the step publishes v1's weights bit for bit as
  the next version, the steps since are marked rolled back, later steps learn only from the restored version on,
  both engines and the relay follow it, and the version after it is a patch against it.
- The canary: the only validator flips the rewards of the first versions, an eval falls, and the run rolls itself
  back to its best evaluated version.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from bench.poisoned_update import parse_args, run_network
from runtime.children import stop_processes
from runtime.ports import free_port
from tests.integration.test_orchestrator_network import metric, wait_for
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import ledger_rows

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START = "builtin:small-qwen3-sort-start"


def test_a_poisoned_batch_past_a_colluding_quorum_is_never_applied(tmp_path: Path) -> None:
    args = parse_args(["--steps", "4", "--groups-per-step", "2", "--scenarios", "poisoned", "--eval-examples", "16"])
    run = run_network(tmp_path, "poisoned", 0, args)
    assert run["breaker_trips"] >= 1 and run["caught_by_trainer"] >= 1, run
    assert run["poisoned_steps_applied"] == [], run
    assert run["bans"] >= 1, run  # three catches ban the poisoner
    assert all(step["step_kind"] == "train" for step in run["steps"]), run


def _config(
    root: Path, port: int, engines: tuple[str, ...] = ("vllm", "hf"), validators: int = 1, **orchestrator: Any
) -> Path:
    config: dict[str, Any] = {
        "run_name": "safety-test",
        "data_dir": str(root / "run"),
        "environment": {"type": "builtin", "name": "sort_digits"},
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {
            "async_level": 1,
            "prompts_per_task": 2,
            "group_size": 4,
            "max_tokens": 16,
            "lease_ttl_s": 60,
        },
        "trust": {"validators_open": True},
        "sources": {"allow": ["127.0.0.0/8"]},
        # every version kept, to compare a restored one with the one it restores
        "policy": {"start_checkpoint": START, "shard_size_bytes": 256 * 1024, "keep_versions": 20},
        "orchestrator": {
            "enabled": True,
            "groups_per_step": 1,
            "trainer_launch": {"nproc": 2},
            "progress_interval_s": 2,
            **orchestrator,
        },
        "local_network": {"enabled": True, "engines": list(engines), "num_validators": validators},
    }
    path = root / "run.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def _weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _steps(root: Path) -> list[Any]:
    return ledger_rows(root, "SELECT step, kind, restore_version, rolled_back, state FROM train_steps ORDER BY step")


def test_a_rollback_by_hand_survives_a_kill_and_every_node_follows_it(tmp_path: Path) -> None:
    from shardcast.format.store import VersionStore
    from shardcast.origin.publish import checkpoint_dir_of

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # room after the rollback: the command's start-up under load took 20 s, four steps of this run
    config = _config(tmp_path, port, num_steps=14)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    log_path = tmp_path / "coordinator.log"
    coordinator = CoordinatorProcess(config, log_path, env, stdout_path=log_path)
    try:
        coordinator.start(url, timeout_s=600)
        wait_for(lambda: (metric(url, "prime_train_steps_done") or 0) >= 2, coordinator, timeout_s=600)
        asked = subprocess.run(
            [str(BIN / "prime-coordinator"), "rollback", "-c", str(config), "--to", "v1", "--lr-scale", "0.5"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert asked.returncode == 0 and "rollback to v1 asked for" in asked.stdout, asked.stderr
        wait_for(lambda: any(kind == "restore" for _, kind, *_ in _steps(tmp_path)), coordinator, timeout_s=300)
        coordinator.kill()  # during the rollback: recorded, maybe restored, maybe published
        coordinator.start(url, timeout_s=600)
        assert coordinator.proc is not None and coordinator.proc.wait(timeout=900) == 0, log_path.read_text()[-4000:]
    finally:
        coordinator.stop()

    network = tmp_path / "run" / "network"
    steps = _steps(tmp_path)
    (restore,) = [row for row in steps if row[1] == "restore"]
    step = restore[0]
    assert restore[2] == 1 and all(row[4] == "published" for row in steps), steps
    assert [row[0] for row in steps if row[3]] == list(range(2, step)), steps  # the steps it undid
    store = VersionStore(tmp_path / "run" / "policies")
    restored, v1 = _weights(checkpoint_dir_of(store, step)), _weights(checkpoint_dir_of(store, 1))
    assert restored.keys() == v1.keys() and all(bool((restored[k] == v1[k]).all()) for k in v1)
    # later steps learn only from the restored version on; both engines and the relay follow it
    later = ledger_rows(
        tmp_path,
        "SELECT s.policy_version, s.body_json FROM step_submissions t JOIN submissions s "
        f"ON s.submission_id = t.submission_id WHERE t.step > {step}",
    )
    assert later and all(version >= step for version, _ in later), later
    for engine in ("vllm", "hf"):  # each loaded the restored version, or one after it
        served = re.findall(r"(?:ready on|now serves) policy v(\d+)", (network / f"worker-{engine}.log").read_text())
        assert max(map(int, served)) >= step, (engine, served)
    relay = VersionStore(network / "relay")
    assert step in relay.versions(), relay.versions()
    (published,) = [
        json.loads(data)
        for subject, data in ledger_rows(tmp_path, "SELECT subject, data_json FROM events WHERE kind = 'publish'")
        if subject == str(step + 1)
    ]
    assert published["published_as"] == "patch" and published["base_version"] == step, published


def test_an_eval_that_falls_rolls_the_run_back_to_its_best_version(tmp_path: Path) -> None:
    """The only validator flips every reward of the first versions (the policy taught to answer wrong, which no check
    of the tokens sees): an eval falls, and the run rolls itself back to its best evaluated version."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = _config(
        tmp_path,
        port,
        engines=("hf",),
        validators=0,
        num_steps=12,
        eval_every_steps=2,
        eval_num_examples=64,
        canary={"noise_z": 1.0, "hold_steps": True},
        trainer={"optimizer": {"lr": 2e-3}},
        # at this learning rate one honest step moves the tiny policy far enough to put over 10% of the next
        # batch's tokens outside the ratio band: the test is about the canary, not that breaker
        breakers={"max_out_of_band_fraction": 0.5},
    )
    env = {"PYTHONPATH": str(REPO_ROOT)}
    log_path = tmp_path / "coordinator.log"
    coordinator = CoordinatorProcess(config, log_path, env, stdout_path=log_path)
    liar: subprocess.Popen[bytes] | None = None
    try:
        coordinator.start(url, timeout_s=600)
        command = [sys.executable, "-m", "tests.support.lying_validator", url, str(tmp_path / "liar")]
        with (tmp_path / "liar.log").open("wb") as out:
            liar = subprocess.Popen(
                [*command, "--flip-versions", "0:4"], stdout=out, stderr=out, env={**os.environ, **env}
            )
        assert coordinator.proc is not None and coordinator.proc.wait(timeout=900) == 0, log_path.read_text()[-4000:]
    finally:
        coordinator.stop()
        if liar is not None:
            stop_processes([liar])
    steps = _steps(tmp_path)
    restores = [row for row in steps if row[1] == "restore"]
    assert restores, (steps, log_path.read_text()[-3000:])
    step, _, version, _, _ = restores[0]
    assert all(row[3] for row in steps if version < row[0] < step), steps  # what the rollback undid
    # once the flipped versions are behind it, the run trains on: its last steps stand
    assert steps[-1][1] == "train" and not steps[-1][3], steps
    events = [json.loads(d) for (d,) in ledger_rows(tmp_path, "SELECT data_json FROM events WHERE kind = 'rollback'")]
    assert any("fell below" in str(event.get("reason", "")) for event in events), events
    assert f"rolled back: v{step} holds the weights of v{version}" in log_path.read_text()
