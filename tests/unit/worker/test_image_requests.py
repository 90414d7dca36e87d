"""A worker's requests for a task whose prompts pin images: each sample is generated with its prompt's images, as
rendered on this node and checked against the pins."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from engines.base import GenerationResult
from environments.base import Environment
from environments.builtin import builtin_environment
from environments.builtin.count_shapes import CountShapes
from environments.pinning import prompt_images
from protocol.schemas import Prompt, SamplingParams, Task
from worker.loop import TaskRunner, WorkerState
from worker.submission import generation_requests


def _task(indices: list[int]) -> Task:
    environment = builtin_environment("count_shapes")
    prompts = [
        Prompt(
            prompt_index=position,
            token_ids=[1, 2, 3],
            example_index=index,
            image_sha256=[image.sha256 for image in environment.example(index).images],
        )
        for position, index in enumerate(indices)
    ]
    return Task(
        task_id="t1",
        lease_id="l1",
        task_name="count_shapes",
        prompts=prompts,
        group_size=2,
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        policy_version=0,
        sampling_seed=7,
        deadline=0.0,
    )


def test_each_sample_is_generated_with_its_prompts_images() -> None:
    environment = builtin_environment("count_shapes")
    task = _task([3, 8])
    images = [prompt_images(environment, p.example_index, p.image_sha256) for p in task.prompts]
    requests = generation_requests(task, (2,), images)
    assert [r.uid for r in requests] == ["t1/0/0", "t1/0/1", "t1/1/0", "t1/1/1"]
    assert [r.images for r in requests] == [images[0], images[0], images[1], images[1]]
    assert images[0] != images[1]
    with pytest.raises(ValueError, match="lists of images"):
        generation_requests(task, (2,), images[:1])


class RecordingEngine:
    """An engine that records the requests it is given and draws one end token for each."""

    name = "hf"

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def generate(self, requests: list[Any]) -> list[Any]:
        self.requests.extend(requests)
        return [GenerationResult(r.uid, [2], [-0.5], "stop", hidden_states=torch.zeros(1, 4)) for r in requests]


class PinnedWeights:
    def pin(self, version: int) -> None: ...
    def unpin(self, version: int) -> None: ...
    def prefetch(self, version: int) -> None: ...


class Abandons:
    def __init__(self) -> None:
        self.abandoned: list[str] = []

    async def abandon(self, lease_id: str) -> None:
        self.abandoned.append(lease_id)


def run_task(environment: Environment, task: Task) -> tuple[RecordingEngine, Abandons, bool]:
    """The engine and ledger a task runner with ``environment`` used on ``task``, and whether it went on to submit."""
    engine, ledger = RecordingEngine(), Abandons()
    runner = TaskRunner(ledger, engine, PinnedWeights(), WorkerState(), (2,), 0, environment=environment)  # type: ignore[arg-type]

    async def generate() -> bool:
        finish = await runner.generate_task(task, asyncio.Event())
        if finish is None:
            return False
        finish.close()
        return True

    return engine, ledger, asyncio.run(generate())


def test_the_task_loop_generates_with_the_images_its_environment_renders() -> None:
    environment = builtin_environment("count_shapes")
    task = _task([3, 8]).model_copy(update={"deadline": time.time() + 60})
    engine, ledger, submitting = run_task(environment, task)
    assert submitting and not ledger.abandoned
    assert [r.images for r in engine.requests] == [environment.example(i).images for i in (3, 3, 8, 8)]


def test_a_task_whose_pinned_images_this_node_does_not_render_is_handed_back() -> None:
    task = _task([3, 8]).model_copy(update={"deadline": time.time() + 60})
    engine, ledger, submitting = run_task(CountShapes(seed=1), task)  # another generator: other pictures
    assert not submitting and ledger.abandoned == ["l1"]
    assert engine.requests == []


def test_a_vllm_engine_is_refused_for_a_vision_language_policy() -> None:
    from protocol.errors import ConfigError
    from trainer.resolve import resolve_model_path
    from worker.devices import DeviceInfo
    from worker.join import create_engine

    device = DeviceInfo(device="cpu", name="cpu", memory_bytes=2**30)
    with pytest.raises(ConfigError, match=r"vision-language model.*--engine hf"):
        create_engine("vllm", resolve_model_path("builtin:tiny-qwen2-vl"), device, 8, "float32")
