"""A LoRA-run worker that skips the adapter, for integration tests: `python -m tests.support.base_only_worker`.

It is `prime-worker join` (HF engine, CPU) except that its engine never loads an adapter: asked for a version's
adapter it keeps serving the base alone, and generates every request with the base. Everything else (leases,
proofs from its own states, submissions) is honest, so what catches it is the validator recomputing with the
version's adapter.

Usage: ``python -m tests.support.base_only_worker COORDINATOR_URL DATA_DIR``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

from engines.base import Engine, GenerationRequest, GenerationResult
from runtime.logs import setup_logging
from worker.config import WorkerConfig
from worker.devices import DeviceInfo
from worker.join import create_engine, run_worker


class BaseOnly:
    """An engine that pretends to load adapters and generates with its base."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = engine.name
        self.vocab_size = engine.vocab_size

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self.engine.generate([replace(request, adapter=None) for request in requests])

    def load_weights(self, checkpoint_dir: Path) -> None:
        self.engine.load_weights(checkpoint_dir)

    def load_adapter(self, name: str, adapter_dir: Path) -> None:
        return None

    def remove_adapter(self, name: str) -> None:
        return None

    def close(self) -> None:
        self.engine.close()


def main() -> None:
    coordinator_url, data_dir = sys.argv[1], Path(sys.argv[2])
    setup_logging("info", json_logs=True)

    def base_only(
        kind: str,
        checkpoint: Path,
        device: DeviceInfo,
        max_batch_size: int,
        dtype: str,
        cpu_compile: bool,
        lora_rank: int | None,
    ) -> Engine:
        return BaseOnly(create_engine(kind, checkpoint, device, max_batch_size, dtype, cpu_compile, lora_rank))

    config = WorkerConfig(coordinator_url=coordinator_url, data_dir=data_dir, engine="hf", gpu="none")
    asyncio.run(run_worker(config, asyncio.Event(), engine_factory=base_only))


if __name__ == "__main__":
    main()
