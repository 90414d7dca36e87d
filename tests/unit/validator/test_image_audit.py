"""A validator audits a vision-language submission with the images it renders itself: an honest group passes, a
group generated with another picture fails its proofs, and a validator that renders other pictures than the ledger
pinned gives an environment error instead of judging the worker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engines.hf import HFEngine
from environments.base import Environment
from environments.builtin import builtin_environment
from environments.pinning import prompt_images
from environments.prompts import EnvironmentPrompts
from protocol.identity import NodeIdentity
from protocol.schemas import PendingSubmission, Prompt, Task
from tests.support.adversary import signed_pending
from trainer.builtin import build_tiny_qwen2_vl
from validator.audit import audit_submission, audit_submissions_safely
from worker.submission import build_submission, generation_requests

GROUP_SIZE = 2


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> HFEngine:
    path = tmp_path_factory.mktemp("vl") / "tiny-qwen2-vl"
    path.mkdir()
    build_tiny_qwen2_vl(path)
    return HFEngine(path, max_batch_size=8)


@pytest.fixture(scope="module")
def task(engine: HFEngine) -> Task:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(engine.model.name_or_path))
    source = EnvironmentPrompts(builtin_environment("count_shapes"), tokenizer, engine.vision)
    prompts = [
        Prompt(
            prompt_index=i,
            token_ids=list(p.token_ids),
            example_index=p.example_index,
            image_sha256=list(p.image_sha256),
        )
        for i, p in enumerate(source.prompt_group(4, 2))
    ]
    return Task(
        task_id="t-1",
        lease_id="l-1",
        task_name="count_shapes",
        prompts=prompts,
        group_size=GROUP_SIZE,
        sampling={"temperature": 1.0, "max_tokens": 6},
        policy_version=0,
        sampling_seed=99,
        deadline=time.time() + 60,
    )


def _submitted(engine: HFEngine, task: Task, shown_by: Environment, example_offset: int = 0) -> PendingSubmission:
    """A worker's submission, generated with the images ``shown_by`` renders for each prompt's example (shifted by
    ``example_offset``: another picture than the one the ledger pinned)."""
    images = [shown_by.example(p.example_index + example_offset).images for p in task.prompts]  # type: ignore[operator]
    results = engine.generate(generation_requests(task, (), images))
    return signed_pending(task, build_submission(task, engine.name, results), NodeIdentity.generate())


def test_an_honest_image_group_is_accepted(engine: HFEngine, task: Task) -> None:
    environment = builtin_environment("count_shapes")
    assert [prompt_images(environment, p.example_index, p.image_sha256) for p in task.prompts]
    verdict, rollouts = audit_submission(_submitted(engine, task, environment), engine, (), images=environment)
    assert verdict.accepted, verdict.reasons
    assert len(rollouts) == len(task.prompts) * GROUP_SIZE


def test_a_group_generated_with_another_picture_is_rejected(engine: HFEngine, task: Task) -> None:
    environment = builtin_environment("count_shapes")
    verdict, _ = audit_submission(
        _submitted(engine, task, environment, example_offset=1), engine, (), images=environment
    )
    assert not verdict.accepted
    assert any("proof" in reason or "logprob" in reason or "sampl" in reason for reason in verdict.reasons), verdict


def test_a_validator_that_renders_other_pictures_reports_its_environment(engine: HFEngine, task: Task) -> None:
    item = _submitted(engine, task, builtin_environment("count_shapes"))
    ((verdict, _),) = audit_submissions_safely([item], engine, (), images=builtin_environment("count_shapes", 1))
    assert not verdict.accepted and verdict.environment_error is not None
    assert "differs from the run's" in verdict.environment_error
    ((unseen, _),) = audit_submissions_safely([item], engine, ())  # no environment to render the images with
    assert unseen.environment_error is not None and "renders none" in unseen.environment_error


@pytest.mark.parametrize("which", ["image_token_id", "vision_start_token_id"])
def test_a_vision_token_in_a_rollout_left_unaudited_is_rejected(engine: HFEngine, task: Task, which: str) -> None:
    """A vision-language policy never draws its vision tokens: one in any rollout, recomputed or not, is a group the
    policy did not draw (and an image token there could not be packed by the trainer)."""
    assert engine.vision is not None
    honest = _submitted(engine, task, builtin_environment("count_shapes"))
    rollouts = list(honest.submission.rollouts)
    last = rollouts[-1]
    rollouts[-1] = last.model_copy(update={"completion_ids": [getattr(engine.vision, which), *last.completion_ids[1:]]})
    tampered = honest.submission.model_copy(update={"rollouts": rollouts})
    item = signed_pending(task, tampered, NodeIdentity.generate()).model_copy(update={"audit_sample_indices": [0]})
    ((verdict, _),) = audit_submissions_safely([item], engine, (), images=builtin_environment("count_shapes"))
    assert not verdict.accepted
    assert any("is never drawn" in reason for reason in verdict.reasons), verdict.reasons
