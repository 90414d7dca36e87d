"""GPU selection: all, none, explicit indices, clear errors for GPUs that are not there; CPU engine threads."""

from __future__ import annotations

import os

import pytest

from protocol.errors import ConfigError
from worker import devices
from worker.devices import detect_devices, parse_gpu_selection


@pytest.mark.parametrize(
    ("selection", "num_gpus", "expected"),
    [("all", 4, [0, 1, 2, 3]), ("all", 0, []), ("none", 8, []), ("2,0", 4, [0, 2]), (" 1 ", 2, [1])],
)
def test_selection(selection: str, num_gpus: int, expected: list[int]) -> None:
    assert parse_gpu_selection(selection, num_gpus) == expected


@pytest.mark.parametrize(("selection", "message"), [("3", "no GPU 3"), ("first", "indices")])
def test_bad_selection_is_explained(selection: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_gpu_selection(selection, 2)


def test_this_machine_falls_back_to_one_cpu_engine() -> None:
    devices = detect_devices("all")
    assert len(devices) >= 1
    if devices[0].device == "cpu":
        assert len(devices) == 1 and devices[0].memory_bytes > 0


@pytest.mark.parametrize(("num_cores", "expected"), [(1, 1), (2, 1), (16, 15)])
def test_cpu_engine_leaves_one_core_to_the_rest_of_the_worker(
    monkeypatch: pytest.MonkeyPatch, num_cores: int, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(num_cores)))
    assert devices.cpu_engine_threads() == expected
