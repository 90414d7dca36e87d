"""The trainer on image samples (built-in tiny-qwen2-vl, count_shapes images): packed rows compute what each sample
computes alone and what the HF engine computes from the exported policy, the images reach the loss, the vision tower
stays frozen unless asked, and sharded training and resume are as exact as for text."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.hf import HFEngine
from protocol.errors import ConfigError
from tests.unit.trainer.vision_probe import LOSS, image_samples, probe_section, run_probe
from trainer.builtin import BUILTIN_PREFIX, TINY_QWEN2_VL
from trainer.config import TrainerSection
from trainer.packing import MicroBatch, VisionPacking, make_micro_batches
from trainer.train import Trainer
from trainer.transport import TrainSample
from trainer.vision import freeze_vision_tower, vision_tower

PROBE = Path(__file__).with_name("vision_probe.py")


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.resolve import resolve_model_path

    return resolve_model_path(BUILTIN_PREFIX + TINY_QWEN2_VL, tmp_path_factory.mktemp("builtin"))


@pytest.fixture(scope="module")
def trainer(vl_dir: Path) -> Trainer:
    """A trainer that never steps (the tests that train build their own)."""
    return Trainer(TrainerSection(model=str(vl_dir), packing={"micro_batch_tokens": 512, "row_tokens": 256}), 1)


def _vision(trainer: Trainer) -> VisionPacking:
    assert trainer.vision_packing is not None
    return trainer.vision_packing


def _places(batch: MicroBatch, samples: list[TrainSample]) -> dict[int, tuple[int, int]]:
    """Where each sample of ``batch`` lies, (row, first column): one after another along the rows."""
    places: dict[int, tuple[int, int]] = {}
    row, column = 0, 0
    for index in batch.sample_ids:
        tokens = samples[index].prompt_ids + samples[index].completion_ids
        if batch.input_ids[row, column : column + len(tokens)].tolist() != tokens:
            row, column = row + 1, 0
        assert batch.input_ids[row, column : column + len(tokens)].tolist() == tokens
        places[index] = (row, column)
        column += len(tokens)
    return places


def _completion_logprobs(trainer: Trainer, samples: list[TrainSample], packed: bool = True) -> list[torch.Tensor]:
    """The trainer's logprobs of each sample's completion tokens, its samples packed into rows (or padded)."""
    packing = trainer.config.packing
    batches = make_micro_batches(
        samples, packing.micro_batch_tokens, packed, packing.row_tokens, trainer.pad_id, _vision(trainer)
    )
    found: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for batch in batches:
            logprobs = trainer._forward_logprobs(batch, 1.0)[0].reshape(batch.input_ids.shape)
            for index, (row, column) in _places(batch, samples).items():
                span = slice(column, column + samples[index].num_tokens)
                found[index] = logprobs[row, span][batch.loss_mask[row, span]]
    return [found[i] for i in range(len(samples))]


def _alone(model: Any, sample: TrainSample, trainer: Trainer) -> torch.Tensor:
    """The completion's logprobs from the model itself: the sample alone, no packing, positions the model's own."""
    vision = _vision(trainer).inputs
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    pixels = vision.pixel_inputs(sample.images)
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            pixel_values=pixels.pixel_values,
            image_grid_thw=pixels.image_grid_thw,
            mm_token_type_ids=vision.image_token_mask(ids),
        ).logits[0, len(sample.prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(sample.completion_ids)[:, None])[:, 0]


def test_packed_image_samples_compute_what_each_alone_and_the_engine_compute(trainer: Trainer, tmp_path: Path) -> None:
    samples = image_samples(trainer, 0, count=4)[:4]
    batches = make_micro_batches(samples, 512, True, 256, trainer.pad_id, _vision(trainer))
    (batch,) = batches
    assert batch.input_ids.shape[0] == 1 and batch.num_samples == 4  # every sample in one row
    assert batch.position_ids.shape == (3, 1, batch.input_ids.shape[1])
    assert batch.image_grid_thw is not None and batch.image_grid_thw.shape[0] == 4
    # Each sample's positions restart at 0; an image's block is 2 x 2 in height and width.
    starts = [sum(samples[i].num_tokens for i in batch.sample_ids[:k]) for k in range(4)]
    assert all(int(batch.position_ids[:, 0, start].abs().sum()) == 0 for start in starts)

    packed = _completion_logprobs(trainer, samples)
    padded = _completion_logprobs(trainer, samples, packed=False)
    exported = trainer.export(tmp_path / "policy")
    assert (exported / "preprocessor_config.json").is_file()
    engine = HFEngine(exported)
    assert engine.vision is not None
    prefilled = engine.prefill(
        [s.prompt_ids for s in samples], [s.completion_ids for s in samples], images=[s.images for s in samples]
    )
    for sample, ours, unpadded, again in zip(samples, packed, padded, prefilled, strict=True):
        alone = _alone(trainer.model, sample, trainer)
        torch.testing.assert_close(ours, alone, atol=1e-5, rtol=0)
        torch.testing.assert_close(unpadded, alone, atol=1e-5, rtol=0)
        served = torch.log_softmax(again.logits, -1).gather(1, torch.tensor(sample.completion_ids)[:, None])[:, 0]
        torch.testing.assert_close(served, ours, atol=1e-5, rtol=0)


def test_another_image_gives_other_logprobs(trainer: Trainer) -> None:
    own = image_samples(trainer, 0, count=2)[:2]
    swapped = [dataclasses.replace(own[0], images=own[1].images), own[1]]
    assert own[0].images[0].sha256 != own[1].images[0].sha256
    before, after = _completion_logprobs(trainer, own), _completion_logprobs(trainer, swapped)
    assert (before[0] - after[0]).abs().max() > 1e-4
    torch.testing.assert_close(before[1], after[1], atol=1e-6, rtol=0)  # its row neighbour is untouched


def test_a_sample_whose_image_tokens_do_not_match_its_images_is_refused(trainer: Trainer) -> None:
    (sample,) = image_samples(trainer, 0, count=1)[:1]
    vision = _vision(trainer)
    with pytest.raises(ValueError, match="holds 4 image tokens, but its 2 image"):
        make_micro_batches([dataclasses.replace(sample, images=sample.images * 2)], 512, vision=vision)
    with pytest.raises(ValueError, match="holds 4 image tokens, but its 0 image"):
        make_micro_batches([dataclasses.replace(sample, images=())], 512, vision=vision)
    with pytest.raises(ValueError, match="reads text only"):
        make_micro_batches([sample], 512)


def test_a_micro_batch_without_images_shows_the_tower_an_idle_one(trainer: Trainer) -> None:
    text_only = image_samples(trainer, 0, count=1)[1]
    assert not text_only.images
    (batch,) = make_micro_batches([text_only], 512, vision=_vision(trainer))
    assert batch.input_ids.shape[0] == 2 and batch.image_grid_thw is not None  # its row and the idle image's
    assert batch.num_samples == 1 and batch.num_real_tokens == text_only.num_tokens
    assert not batch.loss_mask[1].any()
    # Text alone takes plain positions, the same in all three axes.
    length = text_only.num_tokens
    assert batch.position_ids[:, 0, :length].tolist() == [list(range(length))] * 3


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}


@pytest.mark.parametrize("freeze_vision", [True, False])
def test_the_vision_tower_trains_only_when_asked(vl_dir: Path, tmp_path: Path, freeze_vision: bool) -> None:
    """And the engine a worker holds, given the exported policy in place of its weights, serves what trained."""
    trainer = Trainer(probe_section(vl_dir, freeze_vision), num_steps=4)
    tower = vision_tower(trainer.model)
    assert tower is not None
    tower_names = {f"model.visual.{name}" for name in tower.state_dict()}
    before = _weights(trainer)
    metrics = trainer.rl_step(image_samples(trainer, 1), LOSS)
    assert metrics["grad_norm"] > 0
    after = _weights(trainer)
    moved = {name for name, value in after.items() if not torch.equal(value, before[name])}
    assert moved - tower_names  # the text model trains either way
    if freeze_vision:
        assert not moved & tower_names
    else:
        assert "model.visual.patch_embed.proj.weight" in moved and "model.visual.merger.mlp.0.weight" in moved

    engine = HFEngine(vl_dir)
    engine.load_weights(trainer.export(tmp_path / "policy"))
    samples = image_samples(trainer, 2)
    prefilled = engine.prefill(
        [s.prompt_ids for s in samples], [s.completion_ids for s in samples], images=[s.images for s in samples]
    )
    for sample, ours, again in zip(samples, _completion_logprobs(trainer, samples), prefilled, strict=True):
        served = torch.log_softmax(again.logits, -1).gather(1, torch.tensor(sample.completion_ids)[:, None])[:, 0]
        torch.testing.assert_close(served, ours, atol=1e-5, rtol=0)


def test_a_text_model_has_no_vision_tower_to_freeze(tiny_model_dir: Path) -> None:
    from trainer.model import load_model

    with pytest.raises(ConfigError, match="no vision tower to freeze"):
        freeze_vision_tower(load_model(str(tiny_model_dir)))
    text = Trainer(TrainerSection(model=str(tiny_model_dir)), num_steps=1)  # freeze_vision is on: nothing to do
    assert text.vision is None and all(p.requires_grad for p in text.model.parameters())


def test_resume_on_image_samples_reproduces_the_next_step_exactly(vl_dir: Path, tmp_path: Path) -> None:
    first = Trainer(probe_section(vl_dir, freeze_vision=False), num_steps=4)
    first.rl_step(image_samples(first, 1), LOSS)
    first.save(tmp_path / "ckpt")
    expected = first.rl_step(image_samples(first, 2), LOSS)
    expected_weights = _weights(first)

    second = Trainer(probe_section(vl_dir, freeze_vision=False), num_steps=4)
    assert second.resume(tmp_path / "ckpt")
    got = second.rl_step(image_samples(second, 2), LOSS)
    for key in ("loss", "grad_norm", "lr", "entropy"):
        assert got[key] == expected[key], key
    for name, value in _weights(second).items():
        assert torch.equal(value, expected_weights[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("freeze_vision", [True, False])
def test_two_fsdp_ranks_on_image_samples_match_one_process(vl_dir: Path, tmp_path: Path, freeze_vision: bool) -> None:
    """A micro-batch without images and a filler on one rank: every rank still runs the vision tower alike."""
    from safetensors.torch import load_file

    sharded_dir, single_dir = tmp_path / "fsdp2", tmp_path / "single"
    sharded_dir.mkdir()
    single_dir.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROBE)]
    flags = [] if freeze_vision else ["--train-vision"]
    done = subprocess.run(
        [*command, str(vl_dir), str(sharded_dir), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-12000:]
    sharded = json.loads((sharded_dir / "metrics.json").read_text())
    assert sharded["world_size"] == 2

    single = run_probe(vl_dir, single_dir, freeze_vision)
    for got, want in zip(sharded["steps"], single, strict=True):
        assert got["num_micro_batches"] == want["num_micro_batches"] == 3
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        assert got["entropy"] == pytest.approx(want["entropy"], rel=1e-5)
    sharded_weights = load_file(str(sharded_dir / "policy" / "model.safetensors"))
    single_weights = load_file(str(single_dir / "policy" / "model.safetensors"))
    assert sharded_weights.keys() == single_weights.keys()
    for name, value in single_weights.items():
        torch.testing.assert_close(sharded_weights[name], value, atol=2e-6, rtol=1e-4)

    # The state the two ranks saved after step 1 resumes in one process and reproduces step 2.
    resumed = Trainer(probe_section(vl_dir, freeze_vision), num_steps=4)
    assert resumed.resume(sharded_dir / "ckpt")
    again = resumed.rl_step(image_samples(resumed, 2), LOSS)
    assert again["loss"] == pytest.approx(sharded["steps"][1]["loss"], abs=1e-5)
