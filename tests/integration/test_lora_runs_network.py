"""One worker serving two LoRA runs on one base, through two real coordinators.

Two coordinators (two runs, two ledgers) publish the same base as v0 and each its own adapter as v1. One HF
`prime-worker join --also-join` registers with both, starts one engine on the base, and works for both runs
through one adapter per run; each run's validator recomputes with its own adapter and accepts the worker's
work at v1 in both runs. A worker asked to join a run on another base refuses in one line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.network import BIN, Network, running_network, tiny_policy
from tests.support.lora import make_lora_adapter
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow

LORA = {"orchestrator": {"trainer": {"lora": {"enabled": True, "rank": 4, "alpha": 8.0}}}}


def accepted_v1(net: Network) -> list[dict[str, object]]:
    """The verdicts of the run's submissions at version 1 (adapter work), from the run's event log."""
    verdicts = net.verdicts()
    return [
        verdicts[event["subject"]]
        for event in net.events("submit")
        if event["data"].get("policy_version") == 1 and event["subject"] in verdicts
    ]


def test_one_worker_serves_two_lora_runs_on_one_base(tmp_path: Path) -> None:
    base = tiny_policy(tmp_path / "base", seed=0)
    adapters = [make_lora_adapter(base, tmp_path / f"adapter-{run}", rank=4, seed=run + 1) for run in range(2)]
    for name in "abc":
        (tmp_path / name).mkdir()
    with (
        running_network(tmp_path / "a", checkpoints=[base, adapters[0]], sections=LORA) as run_a,
        running_network(tmp_path / "b", checkpoints=[base, adapters[1]], sections=LORA) as run_b,
    ):
        for net in (run_a, run_b):
            net.publish(1)
            net.start_validator()
        worker = run_a.start_worker("worker", "hf", [], "--also-join", run_b.url)

        def both_runs_accepted_adapter_work() -> bool:
            assert worker.poll() is None, run_a.worker_log("worker")
            return all(accepted_v1(net) for net in (run_a, run_b))

        wait_until(both_runs_accepted_adapter_work, 420, "adapter work judged in both runs")
        for net in (run_a, run_b):
            verdicts = list(net.verdicts().values())
            assert all(v["accepted"] for v in verdicts), [v["reasons"] for v in verdicts if not v["accepted"]]
        log = (tmp_path / "a" / "worker.log").read_text(errors="replace")
        lines = [json.loads(line)["event"] for line in log.splitlines() if line.startswith("{")]
        assert sum("engine(s) ready" in line for line in lines) == 1, lines  # one engine, one copy of the base
        assert sum(line.startswith("LoRA run (rank 4)") for line in lines) == 2
        assert (tmp_path / "a" / "worker" / "runs").is_dir()  # the second run's versions apart from the first's

        other_base = tiny_policy(tmp_path / "other-base", seed=5)
        with running_network(tmp_path / "c", checkpoints=[other_base], sections=LORA) as run_c:
            argv = [str(BIN / "prime-worker"), "join", "--coordinator", run_a.url, "--also-join", run_c.url]
            argv += ["--engine", "hf", "--gpu", "none", "--data-dir", str(tmp_path / "refused")]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 2, done.stderr[-3000:]
            assert "trains on another base" in done.stderr and "Traceback" not in done.stderr
