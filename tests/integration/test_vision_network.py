"""Vision-language runs through the real network: `prime-coordinator start` with the built-in ``count_shapes``
(an image in every prompt) and ``builtin:tiny-qwen2-vl``, an HF worker that renders each prompt's image itself, a
validator that renders it again and prefills with it, and the trainer learning from image samples.

The images are pinned by hash in the ledger; no pixels travel. Against a network serving the same run, a worker
that generated with another picture, with the pinned picture perturbed by one pixel, or with another model is
rejected by the validator on its proofs, while the same worker's honest group is accepted; a vLLM worker is refused
at start-up with the fix. vLLM is not in these
runs: its CPU build cannot import its Qwen2-VL path here (docs/models.md, "Vision-language policies").
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import select

from coordinator.ledger.storage.tables import submissions, tasks
from engines.hf import HFEngine
from engines.vision import VisionInputs
from environments.builtin import builtin_environment
from environments.images import Image, image_hashes
from environments.pinning import prompt_images
from environments.truncation import completion_scores, is_truncated
from node.startup import eos_token_ids
from protocol.ledger_client import LedgerClient
from protocol.schemas import SubmitRequest
from tests.support.malicious_worker import Attacker, Outcome
from tests.support.network import ledger_rows, running_network, train_through_local_network
from trainer.resolve import resolve_model_path
from worker.submission import build_submission, generation_requests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

START = "builtin:tiny-qwen2-vl"
COUNT_SHAPES = {"type": "builtin", "name": "count_shapes"}
NUM_STEPS = 2


def test_a_vision_language_run_trains_on_images_every_party_rendered(tmp_path: Path) -> None:
    checkpoint = resolve_model_path(START)

    def shows_images(url: str) -> None:
        assert httpx.get(f"{url}/v1/run-spec", timeout=5).json()["spec"]["images"] is True

    train_through_local_network(tmp_path, "count-shapes", COUNT_SHAPES, START, NUM_STEPS, 6, (), shows_images)
    worker_log = (tmp_path / "run" / "network" / "worker-hf.log").read_text()
    assert "the run's prompts show images" in worker_log
    # the trainer's exports load in the worker's engine as vision-language policies
    assert re.search(r"engine hf now serves policy v[1-9]", worker_log), worker_log[-3000:]

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    eos = eos_token_ids(checkpoint)
    environment = builtin_environment("count_shapes")
    prompts = {row.task_id: json.loads(row.prompts_json) for row in ledger_rows(tmp_path, select(tasks))}
    accepted = [row for row in ledger_rows(tmp_path, select(submissions)) if row.status == "accepted"]
    assert len(accepted) >= NUM_STEPS
    for row in accepted:
        by_index = {p["prompt_index"]: p for p in prompts[row.task_id]}
        verdict = json.loads(row.verdict_json)
        submission = SubmitRequest.model_validate_json(row.body_json)
        for position, rollout in enumerate(submission.rollouts):
            prompt = by_index[rollout.prompt_index]
            example = environment.example(prompt["example_index"])
            assert prompt["image_sha256"] == list(image_hashes(example.images))  # pinned by hash, rendered here
            text = tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
            truncated = is_truncated(rollout.completion_ids, eos)
            expected = completion_scores(environment, example, text, truncated).total
            assert verdict["rewards"][position] == pytest.approx(expected)

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "step"]
    assert [row["step"] for row in steps] == list(range(1, NUM_STEPS + 1))
    for row in steps:
        assert row["num_loss_tokens"] > 0 and row["loss"] == row["loss"], row
    assert VisionInputs.of_checkpoint(tmp_path / "run" / "final-policy") is not None  # exported with its processor


def perturbed(image: Image) -> Image:
    """``image`` with its first pixel's red channel changed."""
    first = (image.rgb[0] + 128) % 256
    return Image(image.width, image.height, bytes([first]) + image.rgb[1:])


async def cheat_with_images(url: str, checkpoint: Path) -> dict[str, Outcome]:
    """How an honest group and each cheat, each on a freshly leased task, were answered."""
    engine = HFEngine(checkpoint, max_batch_size=16)
    other = HFEngine(checkpoint, max_batch_size=16)
    with torch.no_grad():  # another model: the same architecture, its weights moved
        generator = torch.Generator().manual_seed(5)
        for parameter in other.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter.dtype) * 0.02)
    attacker = Attacker(url, engine, eos=eos_token_ids(checkpoint))
    environment = builtin_environment("count_shapes")
    async with LedgerClient(url, attacker.identity) as ledger:
        await attacker.register(ledger)
        for name, shown, generating in (
            ("honest_control", "pinned", engine),
            ("another_image", "another", engine),
            ("perturbed_image", "perturbed", engine),
            ("another_model", "pinned", other),
        ):
            task = await attacker.lease(ledger)
            honest = [prompt_images(environment, p.example_index, p.image_sha256) for p in task.prompts]
            images = {
                "pinned": honest,
                "another": [environment.example((p.example_index or 0) + 1).images for p in task.prompts],
                "perturbed": [tuple(perturbed(image) for image in shown_images) for shown_images in honest],
            }[shown]
            results = generating.generate(generation_requests(task, attacker.eos, images))
            await attacker.submit(ledger, name, build_submission(task, generating.name, results))
    engine.close()
    other.close()
    return {outcome.attack: outcome for outcome in attacker.outcomes}


REJECTED_BY = {"another_image": "toploc", "perturbed_image": "toploc", "another_model": "toploc"}
"""The reason each cheat is rejected with: its proofs do not match the validator's prefill with the pinned images."""


def test_groups_generated_with_other_images_or_another_model_are_rejected(tmp_path: Path) -> None:
    checkpoint = resolve_model_path(START)
    sections = {"trust": {"ban_after_rejections": 100}, "scheduling": {"max_tokens": 6, "lease_ttl_s": 300}}
    with running_network(tmp_path, [checkpoint], environment=COUNT_SHAPES, sections=sections) as net:
        validator = net.start_validator()
        outcomes = asyncio.run(cheat_with_images(net.url, checkpoint))
        assert set(outcomes) == {"honest_control", *REJECTED_BY}
        for outcome in outcomes.values():
            assert outcome.submission_id is not None, outcome  # every group passes the door: only a re-render tells
        net.expect_verdicts({name: str(outcome.submission_id) for name, outcome in outcomes.items()}, REJECTED_BY)
        assert validator.poll() is None, net.worker_log("validator")
        refused = net.start_worker("worker-vllm", "vllm", [])  # its engine is given text only: refused at once
        assert refused.wait(timeout=300) != 0
        assert "shows images with its prompts" in net.worker_log("worker-vllm")
        assert "join it with --engine hf" in net.worker_log("worker-vllm")
