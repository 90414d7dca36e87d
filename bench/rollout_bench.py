"""Rollout throughput: each engine alone, and the whole worker loop against a real coordinator.

For the vLLM and HF engines on the built-in tiny model, built as `prime-worker join --gpu none`
builds them (on a CPU each computes on all cores but one), it measures completion tokens/s of
``engine.generate`` on tasks of 8 prompts x 8 samples (batch 64), then of the worker's task
runner doing the same tasks for real: lease from a `prime-coordinator start` process on
127.0.0.1, generate, build TOPLOC proofs, sign and submit. Prints one JSON object whose
``summary`` holds ``loop_over_engine`` (the worse engine's loop/engine ratio), ``vllm_over_hf``
(engine alone, batch 64), ``vllm_tokens_per_s`` and ``hf_tokens_per_s``.

    python -m bench.rollout_bench [--quick] [--tasks N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w
import torch

from bench.rollout_tasks import GROUP_SIZE, PROMPTS_PER_TASK, local_task
from engines.base import Engine
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import Hardware, RegisterRequest
from runtime.ports import free_port
from shardcast.client.cache import WeightsCache
from tests.support.coordinator_process import CoordinatorProcess
from worker.loop import TaskRunner, WorkerState
from worker.submission import generation_requests

REPO_ROOT = Path(__file__).resolve().parents[1]


def engine_alone(engine: Engine, num_tasks: int, max_tokens: int, tokenizer: Any) -> dict[str, float]:
    engine.generate(generation_requests(local_task(-1, 8, tokenizer), ()))  # warm-up
    tokens, started = 0, time.perf_counter()
    for index in range(num_tasks):
        results = engine.generate(generation_requests(local_task(index, max_tokens, tokenizer), ()))
        tokens += sum(len(result.completion_ids) for result in results)
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}


async def worker_loop(engine: Engine, url: str, checkpoint: Path, num_tasks: int) -> dict[str, float]:
    """The worker's own pipelined task runner, leasing from and submitting to the real coordinator."""
    state = WorkerState()
    async with LedgerClient(url, NodeIdentity.generate()) as ledger:
        hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=2**30)
        await ledger.register(RegisterRequest(role="worker", hardware=hardware, software_version="bench"))
        weights = WeightsCache([f"{url}/shardcast"], "", checkpoint.parent)
        runner = TaskRunner(ledger, engine, weights, state, (), loaded_version=0)
        stop = asyncio.Event()
        started = time.perf_counter()
        running = asyncio.create_task(runner.run(stop))
        while state.num_tasks_done < num_tasks and not running.done():
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - started
        tokens = state.num_tokens
        stop.set()
        await running
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "tasks_submitted": num_tasks,
    }


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return sorted(runs, key=lambda run: run["tokens_per_s"])[len(runs) // 2]


def start_coordinator(root: Path, checkpoint: Path, max_tokens: int) -> tuple[CoordinatorProcess, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run_name": "rollout-bench",
        "data_dir": str(root / "run"),
        "environment": {"type": "python", "target": "bench.rollout_tasks:BenchEnvironment"},
        "api": {"host": "127.0.0.1", "port": port},
        "scheduling": {
            "prompts_per_task": PROMPTS_PER_TASK,
            "group_size": GROUP_SIZE,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "lease_ttl_s": 600,
        },
        "policy": {"start_checkpoint": str(checkpoint)},
    }
    config_path = root / "run.toml"
    config_path.write_text(tomli_w.dumps(config))
    coordinator = CoordinatorProcess(config_path, root / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)})
    coordinator.start(url, timeout_s=120)
    return coordinator, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter tasks (under a minute)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per measurement (default 6; quick 2)")
    parser.add_argument("--repeat", type=int, default=3, help="alternating repetitions; medians are reported")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per sample (default 128; quick 64)")
    args = parser.parse_args()
    num_tasks = args.tasks or (2 if args.quick else 6)
    max_tokens = args.max_tokens or (64 if args.quick else 128)

    from transformers import AutoTokenizer

    from trainer.resolve import resolve_model_path
    from worker.devices import DeviceInfo
    from worker.join import create_engine

    checkpoint = resolve_model_path("builtin:tiny-qwen2")
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    cpu = DeviceInfo(device="cpu", name="cpu", memory_bytes=0)
    hf_engine_threads = 0
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
        coordinator, url = start_coordinator(Path(tmp), checkpoint, max_tokens)
        try:
            for name in ("hf", "vllm"):  # as `prime-worker join --gpu none` builds them
                engine: Engine = create_engine(name, checkpoint, cpu, PROMPTS_PER_TASK * GROUP_SIZE, "float32")
                if name == "hf":
                    hf_engine_threads = torch.get_num_threads()
                # Alternate the two measurements and keep the median of each: this machine is shared.
                alone_runs, loop_runs = [], []
                for _ in range(args.repeat):
                    alone_runs.append(engine_alone(engine, num_tasks, max_tokens, tokenizer))
                    loop_runs.append(asyncio.run(worker_loop(engine, url, checkpoint, num_tasks)))
                engine.close()
                alone, loop = median_run(alone_runs), median_run(loop_runs)
                results[name] = {
                    "engine": alone,
                    "loop": loop,
                    "loop_over_engine": round(loop["tokens_per_s"] / alone["tokens_per_s"], 3),
                    "engine_runs_tokens_per_s": [run["tokens_per_s"] for run in alone_runs],
                    "loop_runs_tokens_per_s": [run["tokens_per_s"] for run in loop_runs],
                }
        finally:
            coordinator.stop()
    summary = {
        "loop_over_engine": min(results[name]["loop_over_engine"] for name in results),
        "vllm_over_hf": round(results["vllm"]["engine"]["tokens_per_s"] / results["hf"]["engine"]["tokens_per_s"], 3),
        "vllm_tokens_per_s": results["vllm"]["engine"]["tokens_per_s"],
        "hf_tokens_per_s": results["hf"]["engine"]["tokens_per_s"],
    }
    detail = {
        "model": "builtin:tiny-qwen2",
        "batch": PROMPTS_PER_TASK * GROUP_SIZE,
        "max_tokens": max_tokens,
        "tasks_per_measurement": num_tasks,
        "hf_engine_threads": hf_engine_threads,  # all cores but one; vLLM's CPU backend also reserves one
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    print(json.dumps({"summary": summary, "engines": results, **detail}))


if __name__ == "__main__":
    main()
