"""A bfloat16 run end to end: the coordinator declares it, workers generate and the validator recomputes in it.

A real coordinator with ``precision = "bfloat16"`` signs it into the run spec; a vLLM and an HF
`prime-worker join` generate in bf16 and a real `prime-validator run` recomputes in bf16 and judges
each submission with the bf16 calibration of the engine that made it: every submission of both
engines is accepted, which the float32 thresholds would not do (tests/unit/toploc/test_bf16.py).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from protocol.identity import load_or_create_identity
from tests.support.network import running_network
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow


def test_a_bf16_run_accepts_the_honest_work_of_both_engines(tmp_path: Path) -> None:
    with running_network(tmp_path, precision="bfloat16") as net:
        assert httpx.get(f"{net.url}/v1/run-spec", timeout=5).json()["spec"]["precision"] == "bfloat16"
        workers = {engine: net.start_worker(f"worker-{engine}", engine, []) for engine in ("vllm", "hf")}
        ids = {engine: load_or_create_identity(net.root / f"worker-{engine}").node_id for engine in workers}
        validator = net.start_validator()

        def judged_by_engine() -> dict[str, list[bool]]:
            found: dict[str, list[bool]] = {engine: [] for engine in ids}
            for verdict in net.verdicts().values():
                for engine, node_id in ids.items():
                    if verdict["worker_id"] == node_id:
                        found[engine].append(verdict["accepted"])
            return found

        def both_judged_twice() -> bool:
            for engine, proc in workers.items():
                assert proc.poll() is None, net.worker_log(f"worker-{engine}")
            assert validator.poll() is None, net.worker_log("validator")
            return all(len(judged) >= 2 for judged in judged_by_engine().values())

        wait_until(both_judged_twice, 420, "two verdicts on each engine's submissions")
        verdicts = list(net.verdicts().values())
        assert all(v["accepted"] for v in verdicts), [v["reasons"] for v in verdicts if not v["accepted"]]
        whole_log = {
            name: (net.root / f"{name}.log").read_text(errors="replace") for name in ("worker-vllm", "validator")
        }
        assert "precision bfloat16" in whole_log["worker-vllm"]
        assert "recomputing in bfloat16" in whole_log["validator"]
