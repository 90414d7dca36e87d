"""A worker whose engine starts slowly, for integration tests: `python -m tests.support.slow_worker`.

It is `prime-worker join` (HF engine, CPU) except that creating the engine waits until a release
file exists, the way a cold vLLM start keeps a worker busy for minutes while gossip announces
newer policy versions that the worker fetches meanwhile. The engine then reads its checkpoint
from the worker's weights cache, where it must still be.

Usage: ``python -m tests.support.slow_worker COORDINATOR_URL DATA_DIR RELEASE_FILE``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

from engines.base import Engine
from runtime.logs import setup_logging
from worker.config import WorkerConfig
from worker.devices import DeviceInfo
from worker.join import create_engine, run_worker

log = logging.getLogger("slow_worker")


def main() -> None:
    coordinator_url, data_dir, release = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    setup_logging("info", json_logs=True)

    def slow_engine(
        kind: str,
        checkpoint: Path,
        device: DeviceInfo,
        max_batch_size: int,
        dtype: str,
        cpu_compile: bool,
        lora_rank: int | None,
    ) -> Engine:
        log.info("engine starting on %s (slowly)", checkpoint)
        deadline = time.monotonic() + 600
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return create_engine(kind, checkpoint, device, max_batch_size, dtype, cpu_compile, lora_rank)

    config = WorkerConfig(coordinator_url=coordinator_url, data_dir=data_dir, engine="hf", gpu="none")
    asyncio.run(run_worker(config, asyncio.Event(), engine_factory=slow_engine))


if __name__ == "__main__":
    main()
