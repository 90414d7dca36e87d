"""Which devices a worker runs engines on: `--gpu all|none|0,1` resolved against the machine.

One engine per selected GPU; a machine without GPUs (or `--gpu none`) runs one CPU engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from protocol.errors import ConfigError


@dataclass(frozen=True)
class DeviceInfo:
    device: str
    """`cuda:N` or `cpu`."""
    name: str
    memory_bytes: int


def parse_gpu_selection(selection: str, num_gpus: int) -> list[int]:
    """GPU indices chosen by ``selection`` on a machine with ``num_gpus`` GPUs (empty means CPU)."""
    text = selection.strip().lower()
    if text == "none":
        return []
    if text == "all":
        return list(range(num_gpus))
    try:
        indices = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise ConfigError(f"--gpu {selection!r}: use 'all', 'none' or indices such as '0,1'") from exc
    missing = [index for index in indices if not 0 <= index < num_gpus]
    if missing:
        raise ConfigError(f"--gpu {selection!r}: this machine has {num_gpus} GPU(s); no GPU {missing[0]}")
    return indices


def detect_devices(selection: str) -> list[DeviceInfo]:
    """The devices to start engines on; imports torch, so call it after argument parsing."""
    import torch

    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    indices = parse_gpu_selection(selection, num_gpus)
    if not indices:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return [DeviceInfo(device="cpu", name="cpu", memory_bytes=int(memory))]
    devices = []
    for index in indices:
        props = torch.cuda.get_device_properties(index)
        devices.append(DeviceInfo(device=f"cuda:{index}", name=props.name, memory_bytes=int(props.total_memory)))
    return devices


def cpu_engine_threads() -> int:
    """Threads a CPU engine computes with: every core this process may use but one, at least one.

    The spare core proves, signs and submits the previous task while the next one generates
    (vLLM's CPU backend reserves one core the same way). Measured with bench/rollout_bench.py on
    2 cores: the HF worker loop made 12.1k tokens/s with both cores in torch, 16.0k with one.
    """
    return max(1, len(os.sched_getaffinity(0)) - 1)
