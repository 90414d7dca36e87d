"""A worker's requests for a task whose prompts pin images: each sample is generated with its prompt's images, as
rendered on this node and checked against the pins."""

from __future__ import annotations

import pytest

from environments.builtin import builtin_environment
from environments.pinning import prompt_images
from protocol.schemas import Prompt, SamplingParams, Task
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
