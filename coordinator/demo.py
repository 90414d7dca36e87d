"""`make demo`: a whole prime-network on 127.0.0.1, as far as it is built today, and honest about the rest.

Starts a coordinator (ledger, SHARDCAST origin, the built-in start checkpoint published as
policy v0, reverse_text tasks), a relay, two workers (vLLM and HF engines) and a validator;
watches the ledger while they generate, prove, submit and audit; publishes a second policy
version half-way so workers fetch it through the relay and hot-reload it; then stops every
process it started and prints where the run's files are. The RL training loop (orchestrator
and trainer steps) is issue 9: here the second version is the same checkpoint republished.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from coordinator.process import CoordinatorProcess, free_port, stop_processes

BIN = Path(sys.executable).parent
console = Console()


class Processes:
    """Child processes of the demo, each stopped by its PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log)

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop_all(self) -> None:
        stop_processes(self.procs.values())


def write_config(root: Path, port: int, start_checkpoint: Path) -> Path:
    import tomli_w

    config = {
        "run_name": "demo",
        "data_dir": str(root / "coordinator"),
        "task": "reverse_text",
        "task_source": "coordinator.builtin_tasks:BuiltinTasks",
        "api": {"host": "127.0.0.1", "port": port, "node_burst": 10000, "ip_burst": 10000},
        "scheduling": {"prompts_per_task": 4, "group_size": 8, "max_tokens": 32, "temperature": 1.0},
        "trust": {"validators_open": True},
        "policy": {"start_checkpoint": str(start_checkpoint), "shard_size_bytes": 256 * 1024},
    }
    path = root / "demo.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def progress(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/stats", timeout=5).json())


class RewardWatch:
    """Mean validator-recomputed reward of the verdicts posted since the last look (event log)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.after = 0

    def mean_reward(self) -> float | None:
        rewards: list[float] = []
        while True:
            params = {"after": self.after, "limit": 1000}
            page = httpx.get(f"{self.url}/v1/events", params=params, timeout=5).json()
            if not page["events"]:
                break
            self.after = page["next_after"]
            for event in page["events"]:
                if event["kind"] == "verdict":
                    rewards += event["data"].get("rewards", [])
        return sum(rewards) / len(rewards) if rewards else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120, help="how long the network runs (default 120)")
    parser.add_argument("--dir", type=Path, default=Path("runs/demo-network"), help="where the run's files go")
    args = parser.parse_args()

    console.print("[bold]prime-network demo[/]: coordinator, relay, 2 workers (vLLM, HF), validator on 127.0.0.1")
    console.print("Not built yet: RL training steps (issue 9); this run generates, proves, distributes and audits.\n")
    from trainer.builtin import resolve_model_path

    console.print("built-in start checkpoint (SFT on first use, a minute or two) ...")
    start = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = write_config(root, port, start)
    coordinator = CoordinatorProcess(config_path, root / "coordinator.log")
    procs = Processes(root)
    try:
        coordinator.start(url, timeout_s=300)
        signer = httpx.get(f"{url}/v1/policy-versions/latest", timeout=5).json()["signer"]
        console.print(f"coordinator {url} (node {signer[:20]}...), policy v0 published")
        relay_port = free_port()
        relay = f"http://127.0.0.1:{relay_port}"
        procs.start(
            "relay",
            [
                str(BIN / "prime-relay"),
                "serve",
                "--upstream",
                f"{url}/shardcast",
                "--port",
                str(relay_port),
                "--coordinator-id",
                signer,
                "--data-dir",
                str(root / "relay"),
                "--json-logs",
            ],
        )
        for engine in ("vllm", "hf"):
            procs.start(
                f"worker-{engine}",
                [
                    str(BIN / "prime-worker"),
                    "join",
                    "--coordinator",
                    url,
                    "--relay",
                    relay,
                    "--engine",
                    engine,
                    "--gpu",
                    "none",
                    "--data-dir",
                    str(root / f"worker-{engine}"),
                    "--json-logs",
                ],
            )
        procs.start(
            "validator",
            [
                str(BIN / "prime-validator"),
                "run",
                "--coordinator",
                url,
                "--data-dir",
                str(root / "validator"),
                "--json-logs",
            ],
        )
        started = time.monotonic()
        republished = False
        watch = RewardWatch(url)
        while time.monotonic() - started < args.seconds:
            time.sleep(5)
            procs.check()
            stats = progress(url)
            status = stats["status"]
            workers = [n for n in stats["nodes"] if n["role"] == "worker"]
            reward = watch.mean_reward()
            reward_text = "-" if reward is None else f"{reward:.3f}"
            console.print(
                f"{time.monotonic() - started:5.0f}s  policy v{status['current_policy_version']}  "
                f"accepted {status['num_submissions_accepted']}  rejected {status['num_submissions_rejected']}  "
                f"pending {status['num_submissions_pending']}  live workers {len(workers)}  reward {reward_text}"
            )
            if not republished and time.monotonic() - started > args.seconds / 2:
                argv = [str(BIN / "prime-coordinator"), "publish", str(start), "-c", str(config_path)]
                subprocess.run(argv, check=True, capture_output=True)
                console.print("published policy v1 (workers fetch it through the relay and reload in place)")
                republished = True
    finally:
        procs.stop_all()
        coordinator.stop()
    console.print(f"\nstopped everything; run files, logs and the ledger are in {root}")


if __name__ == "__main__":
    main()
