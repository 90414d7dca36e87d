"""What a run shows, end to end: a real RL run whose policy never ends a completion.

`prime-coordinator start` with `[orchestrator]` (evals every 2 steps) and `[local_network]` (one HF
worker, one validator, a relay, the torchrun trainer) trains a few steps from a tiny random policy
whose EOS logit is pushed far down: every rollout runs to `max_tokens`, as a policy that learned
to pad would. The run must show it everywhere: `data_dir/metrics.jsonl` holds one row per step
with the trainer's figures and the batch's length, stop and truncated fractions (truncated 1, stop
0), and one eval row for v0, every second policy and the last, on schedule; the ledger keeps the
evals with their steps; the progress line, the reward curve, /metrics and the dashboard carry them
while the run goes on; the evals' policy copies are gone at the end.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.startup import eos_token_ids
from runtime.ports import free_port
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import SPEC, ledger_rows, tiny_policy
from tests.support.run_configs import write_small_run
from tests.support.tiny_model import TINY_EOS_TOKEN_ID

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_STEPS = 3
EVAL_EVERY_STEPS = 2
EVAL_NUM_EXAMPLES = 6
MAX_TOKENS = 8
STEP_KEYS = {
    "loss",
    "entropy",
    "grad_norm",
    "mismatch_kl",
    "batch_reward_mean",
    "batch_completion_tokens_mean",
    "batch_stop_fraction",
    "batch_truncated_fraction",
}
EVAL_KEYS = {"eval_accuracy", "eval_reward_mean", "eval_stop_fraction", "eval_completion_tokens_mean"}


def never_ending_policy(path: Path) -> Path:
    """A tiny random policy that never draws a token its workers stop on: its config's EOS is pushed far down, and
    every other end token they stop on (the tokenizer's, another id) gets the same output row."""
    from safetensors.torch import load_file, save_file

    policy = tiny_policy(path, seed=5, spec=replace(SPEC, eos_bias=-40.0))
    weights = load_file(str(policy / "model.safetensors"))
    head = weights["lm_head.weight"]
    for token in eos_token_ids(policy):
        head[token] = head[TINY_EOS_TOKEN_ID]
    save_file(weights, str(policy / "model.safetensors"), metadata={"format": "pt"})
    return policy


def write_config(root: Path, port: int, start_checkpoint: Path) -> Path:
    return write_small_run(
        root,
        port,
        "run-metrics-test",
        start_checkpoint,
        NUM_STEPS,
        MAX_TOKENS,
        progress_interval_s=1,
        eval_every_steps=EVAL_EVERY_STEPS,
        eval_num_examples=EVAL_NUM_EXAMPLES,
    )


def gauges(url: str) -> dict[str, float]:
    try:
        body = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.TransportError:
        return {}
    return {m[1]: float(m[2]) for m in re.finditer(r"^(prime_train_\w+) (\S+)$", body, re.MULTILINE)}


def dashboard_training(url: str) -> dict[str, Any] | None:
    try:
        training = httpx.get(f"{url}/v1/dashboard", timeout=5).json().get("training")
    except (httpx.TransportError, ValueError):
        return None
    return training if isinstance(training, dict) else None


def test_a_run_that_never_stops_a_completion_shows_it_in_every_place(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start_checkpoint = never_ending_policy(tmp_path / "start")
    coordinator = CoordinatorProcess(
        write_config(tmp_path, port, start_checkpoint),
        tmp_path / "coordinator.log",
        {"PYTHONPATH": str(REPO_ROOT)},
        stdout_path=tmp_path / "coordinator.out",
    )
    coordinator.start(url, timeout_s=300)
    seen_gauges: dict[str, float] = {}
    seen_training: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 900
        while coordinator.proc is not None and coordinator.proc.poll() is None and time.monotonic() < deadline:
            seen_gauges |= gauges(url)
            training = dashboard_training(url)
            if training is not None:
                seen_training = training
            time.sleep(1)
        assert coordinator.proc is not None
        rc = coordinator.proc.wait(timeout=60)
    finally:
        coordinator.stop()
    log = (tmp_path / "coordinator.log").read_text()
    stdout = (tmp_path / "coordinator.out").read_text()
    assert rc == 0, log[-4000:]

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "step"]
    evals = [row for row in rows if row["kind"] == "eval"]
    assert [row["step"] for row in steps] == list(range(1, NUM_STEPS + 1)), rows
    for row in steps:
        assert set(row) >= STEP_KEYS, f"step {row['step']} lacks {STEP_KEYS - set(row)}"
        # no rollout ended with EOS: every one ran to the budget
        assert row["batch_truncated_fraction"] == 1.0 and row["batch_stop_fraction"] == 0.0
        assert row["batch_completion_tokens_mean"] == MAX_TOKENS
    assert sorted(row["step"] for row in evals) == [0, 2, 3], rows  # v0, every second policy, the last
    for row in evals:
        assert set(row) >= EVAL_KEYS and row["eval_num_examples"] == EVAL_NUM_EXAMPLES
        assert 0.0 <= row["eval_accuracy"] <= 1.0
        assert row["eval_stop_fraction"] <= 0.2 and row["eval_completion_tokens_mean"] >= 0.8 * MAX_TOKENS

    ledger = {step: json.loads(m) for step, m in ledger_rows(tmp_path, "SELECT step, metrics_json FROM train_steps")}
    assert [s for s in sorted(ledger) if "eval_accuracy" in ledger[s]] == [2, 3]
    assert not list((tmp_path / "run" / "evals").glob("step_*/policy")), "an eval's policy copy was left behind"

    assert re.search(r"len 8\.0  stop 0\.00  trunc 1\.00", stdout), stdout[-3000:]
    assert re.search(r"eval v\d acc \d\.\d{3} reward \d\.\d{3}", stdout), stdout[-3000:]
    assert "eval of policy v3: accuracy" in log
    assert "metrics.jsonl" in stdout

    assert seen_gauges.get("prime_train_step_truncated_fraction") == 1.0, seen_gauges
    assert seen_gauges.get("prime_train_step_stop_fraction") == 0.0
    assert seen_gauges.get("prime_train_step_completion_tokens") == MAX_TOKENS
    assert seen_gauges.get("prime_train_eval_step", 0) >= 2
    for gauge in ("loss", "entropy", "mismatch_kl", "grad_norm"):  # the trainer's own figures, as it reported them
        assert f"prime_train_step_{gauge}" in seen_gauges, seen_gauges
        assert seen_gauges[f"prime_train_step_{gauge}"] in {ledger[step][gauge] for step in ledger}, gauge
    assert [s["truncated_fraction"] for s in seen_training.get("steps", [])][:1] == [1.0], seen_training
    assert all(s["entropy"] > 0 and s["grad_norm"] >= 0 for s in seen_training.get("steps", [])), seen_training
    assert 0 in [e["step"] for e in seen_training.get("evals", [])], seen_training
