"""The trainer's side of the training-safety contract: behaviour log-probabilities it recomputes itself, breakers
that refuse an update and leave everything as it was, skipped and restored steps, and exact resume of all of it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from tests.integration.trainer.fsdp_probe import probe_batch
from trainer.breakers import StepFigures, breaker_trips
from trainer.config import BreakerConfig, LossConfig, OptimizerConfig, TrainerSection
from trainer.optim import RESTORE_WARMUP_STEPS
from trainer.train import Trainer
from trainer.transport import TrainSample

RECOMPUTE = LossConfig(behaviour_logprobs="recompute")
OFF = BreakerConfig(enabled=False)


def _trainer(model: Path, versions: int = 2) -> Trainer:
    section = TrainerSection(model=str(model), optimizer=OptimizerConfig(lr=1e-3), packing={"micro_batch_tokens": 256})
    trainer = Trainer(section, num_steps=10)
    trainer.keep_behaviour(versions)
    return trainer


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _honest(trainer: Trainer, samples: list[TrainSample], version: int | None = None) -> list[TrainSample]:
    """``samples`` with the policy's own log-probabilities (under the trainer's weights now) as their claims."""
    claimed = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
            logits = trainer.model(input_ids=ids).logits[0].float()
            logprobs = torch.log_softmax(logits, -1)
            start = len(sample.prompt_ids) - 1
            values = [logprobs[start + i, t].item() for i, t in enumerate(sample.completion_ids)]
            claimed.append(dataclasses.replace(sample, inference_logprobs=values, policy_version=version, group=0))
    return claimed


def test_a_forged_claim_changes_nothing_the_trainer_applies(tiny_model_dir: Path) -> None:
    honest_trainer, forged_trainer = _trainer(tiny_model_dir), _trainer(tiny_model_dir)
    batch = _honest(honest_trainer, probe_batch(honest_trainer, 3), version=0)
    forged = [dataclasses.replace(s, inference_logprobs=[-20.0] * len(s.completion_ids)) for s in batch[:3]]
    honest = honest_trainer.rl_step(batch, RECOMPUTE, breakers=OFF)
    lied = forged_trainer.rl_step([*forged, *batch[3:]], RECOMPUTE, breakers=OFF)
    assert honest["loss"] == lied["loss"] and honest["grad_norm"] == lied["grad_norm"]
    for name, value in _params(honest_trainer).items():
        assert torch.equal(value, _params(forged_trainer)[name]), name
    # the claims are compared, never used: the forged samples stand out, the honest ones match
    assert max(lied["claim_errors"][:3]) > 5 and max(lied["claim_errors"][3:]) < 1e-4
    assert max(honest["claim_errors"]) < 1e-4


def test_the_sampler_numbers_move_the_update_when_they_are_trusted(tiny_model_dir: Path) -> None:
    """The contrast the contract exists for: with ``sampler`` the same forged claims do change the update."""
    first, second = _trainer(tiny_model_dir), _trainer(tiny_model_dir)
    batch = _honest(first, probe_batch(first, 3), version=0)
    forged = [dataclasses.replace(s, inference_logprobs=[-20.0] * len(s.completion_ids)) for s in batch]
    sampler = LossConfig(behaviour_logprobs="sampler")
    assert first.rl_step(batch, sampler, breakers=OFF)["loss"] != second.rl_step(forged, sampler, breakers=OFF)["loss"]


def test_older_samples_are_scored_with_the_weights_of_the_version_that_drew_them(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    v0 = _honest(trainer, probe_batch(trainer, 4), version=0)  # claims computed with v0's weights
    trainer.rl_step(_honest(trainer, probe_batch(trainer, 5), version=0), RECOMPUTE, breakers=OFF)
    assert trainer.step == 1 and trainer.behaviour is not None and trainer.behaviour.versions == [0, 1]
    metrics = trainer.rl_step(v0, RECOMPUTE, breakers=OFF)  # v0's samples, trained by v1
    assert max(metrics["claim_errors"]) < 1e-4  # recomputed with v0's weights, not v1's
    assert metrics["mismatch_kl"] > 0 and metrics["behaviour_recompute_s"] > 0
    mislabelled = trainer.rl_step([dataclasses.replace(s, policy_version=2) for s in v0], RECOMPUTE, breakers=OFF)
    assert max(mislabelled["claim_errors"]) > 1e-3  # said to be v2's: scored with v2's weights, which differ


def test_samples_of_a_version_no_longer_kept_are_not_trained(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir, versions=1)
    trainer.rl_step(_honest(trainer, probe_batch(trainer, 5), version=0), RECOMPUTE, breakers=OFF)
    old = _honest(trainer, probe_batch(trainer, 6), version=0)
    current = _honest(trainer, probe_batch(trainer, 7), version=1)
    metrics = trainer.rl_step([*old, *current], RECOMPUTE, breakers=OFF)
    assert metrics["untrusted_samples"] == len(old) and metrics["num_samples"] == len(current)


def test_a_tripped_breaker_leaves_model_optimizer_and_step_as_they_were(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    trainer.rl_step(_honest(trainer, probe_batch(trainer, 1), version=0), RECOMPUTE, breakers=BreakerConfig())
    before, moments = (
        _params(trainer),
        {k: v["exp_avg"].clone() for k, v in enumerate(trainer.optimizer.state.values())},
    )
    lr = trainer.scheduler.get_last_lr()
    poisoned = [dataclasses.replace(s, advantage=1e6) for s in _honest(trainer, probe_batch(trainer, 2), version=1)]
    metrics = trainer.rl_step(poisoned, RECOMPUTE, breakers=BreakerConfig())
    assert metrics["tripped"] and "gradient norm" in metrics["tripped"][0]
    assert trainer.step == 1 and trainer.scheduler.get_last_lr() == lr and trainer.grad_norms == trainer.grad_norms[:1]
    for name, value in _params(trainer).items():
        assert torch.equal(value, before[name]), name
    for key, state in enumerate(trainer.optimizer.state.values()):
        assert torch.equal(state["exp_avg"], moments[key])
    assert all(p.grad is None for p in trainer.model.parameters())
    honest = trainer.rl_step(_honest(trainer, probe_batch(trainer, 2), version=1), RECOMPUTE, breakers=BreakerConfig())
    assert "tripped" not in honest and trainer.step == 2


def test_each_breaker_trips_on_its_own_figure_and_not_on_an_honest_one() -> None:
    config = BreakerConfig(grad_norm_ceiling=50, grad_norm_median_factor=10, median_min_steps=3)
    honest = StepFigures(grad_norm=0.8, loss=0.1, out_of_band_fraction=0.01, mismatch_kl=0.001)
    history = [0.5, 0.7, 0.9, 0.6]
    assert breaker_trips(honest, history, config) == []
    cases = {
        "non-finite": dataclasses.replace(honest, grad_norm=math.nan),
        "ceiling": dataclasses.replace(honest, grad_norm=60.0),
        "median": dataclasses.replace(honest, grad_norm=7.0),
        "outside": dataclasses.replace(honest, out_of_band_fraction=0.2),
        "mismatch KL": dataclasses.replace(honest, mismatch_kl=0.9),
    }
    for word, figures in cases.items():
        trips = breaker_trips(figures, [] if word == "ceiling" else history, config)
        assert len(trips) == 1 and word in trips[0], (word, trips)
    assert breaker_trips(cases["median"], history[:2], config) == []  # too little history for a median
    # with the behaviour numbers the trainer's own, the band and the KL measure how far the policy moved: no trip
    drifted = dataclasses.replace(honest, out_of_band_fraction=0.4, mismatch_kl=0.9, recomputed=True)
    assert breaker_trips(drifted, history, config) == []
    assert breaker_trips(dataclasses.replace(cases["ceiling"], recomputed=True), [], config)
    assert breaker_trips(cases["ceiling"], history, BreakerConfig(enabled=False)) == []
    with pytest.raises(ValueError, match="ratio_band"):
        BreakerConfig(ratio_band=(1.2, 2.0))


def test_a_skipped_step_keeps_the_weights_and_a_restore_brings_back_an_exported_version(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer = _trainer(tiny_model_dir)
    v0 = _params(trainer)
    exported = trainer.export(tmp_path / "v0")
    trainer.rl_step(_honest(trainer, probe_batch(trainer, 1), version=0), RECOMPUTE, breakers=OFF)
    v1 = _params(trainer)
    assert trainer.skip_step()["skipped"] and trainer.step == 2
    assert all(torch.equal(value, v1[name]) for name, value in _params(trainer).items())
    lr = trainer.scheduler.base_lrs[0]
    restored = trainer.restore_step(exported, lr_scale=0.5)
    assert restored["step"] == 3 and trainer.scheduler.base_lrs[0] == pytest.approx(lr * 0.5)
    assert all(torch.equal(value, v0[name]) for name, value in _params(trainer).items())
    assert not trainer.optimizer.state  # Adam's moments start over
    assert trainer.behaviour is not None and trainer.behaviour.versions == [2, 3]
    # the learning rate warms up again (the run has no warm-up of its own: over RESTORE_WARMUP_STEPS), resumed too
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(lr * 0.5 / RESTORE_WARMUP_STEPS)
    trainer.save(tmp_path / "ckpt")
    again = _trainer(tiny_model_dir)
    assert again.resume(tmp_path / "ckpt") and again.step == 3
    for _ in range(RESTORE_WARMUP_STEPS):
        assert again.scheduler.get_last_lr() == trainer.scheduler.get_last_lr()
        again.skip_step(), trainer.skip_step()
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(lr * 0.5)


def test_resume_restores_the_kept_versions_and_the_breakers_history(tiny_model_dir: Path, tmp_path: Path) -> None:
    first = _trainer(tiny_model_dir)
    stale = _honest(first, probe_batch(first, 8), version=0)
    first.rl_step(_honest(first, probe_batch(first, 1), version=0), RECOMPUTE, breakers=BreakerConfig())
    first.save(tmp_path / "ckpt")
    expected = first.rl_step(stale, RECOMPUTE, breakers=BreakerConfig())
    expected_params = _params(first)

    second = _trainer(tiny_model_dir)
    assert second.resume(tmp_path / "ckpt") and second.step == 1 and second.grad_norms == first.grad_norms[:1]
    assert second.behaviour is not None and second.behaviour.versions == [0, 1]
    got = second.rl_step(stale, RECOMPUTE, breakers=BreakerConfig())
    assert (got["loss"], got["grad_norm"], got["mismatch_kl"]) == (
        expected["loss"],
        expected["grad_norm"],
        expected["mismatch_kl"],
    )
    for name, value in _params(second).items():
        assert torch.equal(value, expected_params[name]), name


def _drawn(trainer: Trainer, prompt: list[int], num_tokens: int, seed: int, stream: int, version: int) -> TrainSample:
    """A sample drawn by the trainer's weights now, as a worker draws (seeded Gumbel noise), with its draws."""
    from toploc.sampling import draw_tokens
    from trainer.transport import Draws

    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        for position in range(num_tokens):
            logits = trainer.model(input_ids=torch.tensor([prompt + tokens])).logits[0, -1:].float()
            token = int(draw_tokens(logits, 1.0, seed, torch.tensor([stream]), torch.tensor([position]))[0])
            logprobs.append(float(torch.log_softmax(logits[0], -1)[token]))
            tokens.append(token)
    draws = Draws(seed, [stream] * num_tokens, list(range(num_tokens)))
    return TrainSample(prompt, tokens, 0.5 - stream % 2, logprobs, policy_version=version, group=stream, draws=draws)


def test_the_trainer_replays_every_trained_draw_and_refuses_tokens_the_policy_did_not_draw(
    tiny_model_dir: Path,
) -> None:
    breakers = BreakerConfig(draw_tolerance=1e-3)
    trainer = _trainer(tiny_model_dir)
    prompt = trainer.tokenizer.encode("reverse: abc\n", add_special_tokens=False)
    old = [_drawn(trainer, prompt, 6, seed=11, stream=s, version=0) for s in range(4)]  # drawn by v0
    first = trainer.rl_step(old[:2], RECOMPUTE, breakers=breakers)
    assert "tripped" not in first and first["draw_gap_max"] < 1e-3
    # v0's draws trained by v1: replayed with v0's weights, so they still hold
    honest = [*old[2:], *[_drawn(trainer, prompt, 6, seed=12, stream=s, version=1) for s in range(4, 6)]]
    assert "tripped" not in trainer.rl_step(honest, RECOMPUTE, breakers=breakers)
    # a copied sample: another stream's tokens under this one's draws (what a worker saving compute submits)
    now = [_drawn(trainer, prompt, 6, seed=13, stream=s, version=2) for s in range(6, 9)]
    copied = dataclasses.replace(
        now[1], completion_ids=now[0].completion_ids, inference_logprobs=now[0].inference_logprobs
    )
    before = _params(trainer)
    refused = trainer.rl_step([now[0], copied, now[2]], RECOMPUTE, breakers=breakers)
    assert refused["tripped"] == ["1 samples hold tokens that are not the policy's seeded draw"]
    assert refused["off_draw_groups"] == [7] and trainer.step == 2
    assert all(torch.equal(value, before[name]) for name, value in _params(trainer).items())


def test_a_lora_run_restores_an_exported_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from trainer.config import LoraConfig

    section = TrainerSection(
        model=str(tiny_model_dir), optimizer=OptimizerConfig(lr=1e-2), lora=LoraConfig(enabled=True, rank=4, alpha=8)
    )
    trainer = Trainer(section, num_steps=10)
    trainer.keep_behaviour(2)
    trainer.rl_step(_honest(trainer, probe_batch(trainer, 1), version=0), RECOMPUTE, breakers=OFF)
    adapter = trainer.export(tmp_path / "v1")
    v1 = _params(trainer)
    trainer.rl_step(_honest(trainer, probe_batch(trainer, 2), version=1), RECOMPUTE, breakers=OFF)
    assert any(not torch.equal(value, v1[name]) for name, value in _params(trainer).items())
    trainer.restore_step(adapter)
    assert all(torch.equal(value, v1[name]) for name, value in _params(trainer).items())
