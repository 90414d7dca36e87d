"""Pure orchestrator rules: samples and advantages from accepted groups, the step's version floor, the lease rule."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.ledger.batches import (
    AcceptedGroup,
    BatchRules,
    accepted_group,
    batch_summary,
    episode_prompts,
    rendered_images,
    rollout_stats,
    sampled_fraction,
    train_samples,
    verdict_rewards,
)
from coordinator.ledger.scheduling import lease_room
from coordinator.ledger.step_metrics import named_rewards, step_figure
from coordinator.ledger.train_steps import min_policy_version
from protocol.schemas import Rollout, SubmitRequest, TurnRollout, Verdict
from trainer.transport import StepBatch, TrainDir, TrainSample


def group_columns(rewards: list[float], components: dict[str, list[float]] | None = None) -> tuple[str, str, str]:
    """Ledger columns of one accepted submission: 2 prompts x 2 samples, rollouts stored out of order."""
    prompts = [{"prompt_index": 0, "token_ids": [10, 11]}, {"prompt_index": 1, "token_ids": [20]}]
    order = [(1, 1), (0, 1), (1, 0), (0, 0)]
    rollouts = [
        Rollout(
            prompt_index=p,
            sample_index=s,
            completion_ids=[100 + 10 * p + s],
            logprobs=[-0.1 * (p + 1)],
            finish_reason="stop",
            proof_b64="AAAA",
        )
        for p, s in order
    ]
    body = SubmitRequest(lease_id="l", task_id="t", policy_version=3, engine="hf", rollouts=rollouts)
    verdict = Verdict(submission_id="s", accepted=True, rewards=rewards, reward_components=components or {})
    return json.dumps(prompts), body.model_dump_json(), verdict.model_dump_json()


def test_samples_are_grouped_per_prompt_with_task_tokens_and_validator_rewards() -> None:
    # rewards follow the stored rollout order: (1,1), (0,1), (1,0), (0,0)
    prompts, body, verdict = group_columns([0.9, 0.4, 0.1, 0.0])
    group = accepted_group("s", 3, prompts, body, verdict)
    samples = train_samples([group])
    assert [s.completion_ids for s in samples] == [[100], [101], [110], [111]]
    assert [s.prompt_ids for s in samples] == [[10, 11], [10, 11], [20], [20]]
    assert [s.reward for s in samples] == [0.0, 0.4, 0.1, 0.9]
    assert [s.advantage for s in samples] == pytest.approx([-0.2, 0.2, -0.4, 0.4])
    assert samples[2].inference_logprobs == pytest.approx([-0.2])
    normalized = train_samples([group], BatchRules(normalize_std=True))
    assert [s.advantage for s in normalized] == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-4)
    summary = batch_summary([group], trained_version=5)
    assert summary["staleness_mean"] == 2 and summary["num_samples"] == 4
    assert summary["reward_mean"] == pytest.approx(0.35)


def test_an_episode_trains_only_its_sampled_tokens_with_their_checked_logprobs() -> None:
    """Turns 0 and 1 extend each other (one sample, the reply between them unsampled); turn 2's prompt does not
    extend them (a sample of its own). Whatever the worker sent besides its sampled turns plays no part."""
    prompts, body, verdict = group_columns([0.9, 0.4, 0.1, 0.0])
    group = accepted_group("s", 3, prompts, body, verdict)
    turn = TurnRollout(completion_ids=[7, 8], logprobs=[-0.7, -0.8], finish_reason="stop", proof_b64="AAAA")
    last = TurnRollout(completion_ids=[9], logprobs=[-0.9], finish_reason="stop", proof_b64="AAAA")
    rollouts = [r.model_copy(update={"later_turns": [turn, last]}) for r in group.submission.rollouts]
    episodes = replace(group, submission=group.submission.model_copy(update={"rollouts": rollouts}))

    def rebuilt(group: AcceptedGroup, rollout: Rollout) -> list[list[int]]:
        first = [*group.prompt_token_ids[rollout.prompt_index], *rollout.completion_ids]
        return [first[: -len(rollout.completion_ids)], [*first, 50, 51], [60]]

    with pytest.raises(ValueError, match="later turns in a single-turn run"):
        train_samples([episodes])
    samples = train_samples([episodes], turn_prompts=rebuilt)
    assert len(samples) == 8
    merged, alone = samples[0], samples[1]  # prompt 0, sample 0: reward 0.0, advantage -0.2
    assert merged.prompt_ids == [10, 11] and merged.completion_ids == [100, 50, 51, 7, 8]
    assert merged.sampled == [True, False, False, True, True]
    assert merged.inference_logprobs == pytest.approx([-0.1, 0.0, 0.0, -0.7, -0.8])
    assert alone.prompt_ids == [60] and alone.completion_ids == [9] and alone.sampled is None
    assert merged.advantage == alone.advantage == pytest.approx(-0.2)
    assert train_samples([group]) == train_samples(
        [group], turn_prompts=lambda g, r: [g.prompt_token_ids[r.prompt_index]]
    )


def test_the_loop_rebuilds_an_episodes_prompts_by_replaying_the_environment() -> None:
    """A calculator episode as the ledger stores it: the trusted side replays the tool, rebuilds both turn prompts
    with the policy's template, merges the turns and trains only the policy's tokens."""
    from transformers import AutoTokenizer

    from environments.builtin.calculator import Calculator
    from environments.render import prompt_ids
    from trainer.resolve import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path("builtin:small-qwen3")))
    eos = (tokenizer.eos_token_id,)
    environment = Calculator(seed=0)
    example = environment.example(5)
    first, second = [[*tokenizer.encode(t, add_special_tokens=False), *eos] for t in (f"calc {example.data}", "7")]
    rollout = Rollout(
        prompt_index=0,
        sample_index=0,
        completion_ids=first,
        logprobs=[-0.5] * len(first),
        finish_reason="stop",
        proof_b64="AAAA",
        later_turns=[
            TurnRollout(completion_ids=second, logprobs=[-0.25] * len(second), finish_reason="stop", proof_b64="AAAA")
        ],
    )
    body = SubmitRequest(lease_id="l", task_id="t", policy_version=0, engine="hf", rollouts=[rollout])
    verdict = Verdict(submission_id="s", accepted=True, rewards=[0.0])
    issued = prompt_ids(environment, example, tokenizer)
    task_prompts = json.dumps([{"prompt_index": 0, "token_ids": issued, "example_index": 5}])
    group = accepted_group("s", 0, task_prompts, body.model_dump_json(), verdict.model_dump_json())
    turn_prompts = episode_prompts(environment, tokenizer, eos)
    (sample,) = train_samples([group], turn_prompts=turn_prompts)
    assert sample.prompt_ids == issued and sample.sampled is not None
    trained = [t for t, flag in zip(sample.completion_ids, sample.sampled, strict=True) if flag]
    assert trained == first + second
    reply = tokenizer.decode([t for t, flag in zip(sample.completion_ids, sample.sampled, strict=True) if not flag])
    assert f"= {example.answer}" in reply  # the tool's real answer, computed here, not sent by the worker
    assert sampled_fraction([sample]) == pytest.approx(len(trained) / len(sample.completion_ids))
    stats = rollout_stats([group])
    assert stats["turns_mean"] == 2.0 and stats["completion_tokens_mean"] == len(first) + len(second)
    other = replace(group, example_indices={0: 6})  # the ledger's prompt is example 5's, not 6's
    with pytest.raises(ValueError, match="the environment's first prompt is not the task's"):
        turn_prompts(other, rollout)


def test_each_named_reward_has_its_batch_mean_in_the_step_metrics() -> None:
    from coordinator.serving.dashboard.training import TrainingHistory
    from protocol.schemas import Event

    components = {"exact": [1.0, 0.0, 0.0, 0.0], "short": [1.0, 1.0, 0.5, 0.0]}
    group = accepted_group("s", 3, *group_columns([1.0, 0.25, 0.125, 0.0], components))
    summary = batch_summary([group], trained_version=4)
    assert summary["reward_mean/exact"] == pytest.approx(0.25)
    assert summary["reward_mean/short"] == pytest.approx(0.625)
    metrics = {f"batch_{k}": v for k, v in summary.items()} | {"batch_reward_mean/junk": float("nan")}
    assert named_rewards(metrics) == {"exact": pytest.approx(0.25), "short": pytest.approx(0.625)}
    assert named_rewards("not metrics") == {}
    history = TrainingHistory()
    trained = {"state": "trained", "metrics": metrics}
    history.fold(Event(event_id=1, at=1.0, kind="train_step", node_id=None, subject="1", data=trained))
    training = history.summary()
    assert training is not None and training.steps[0].rewards == {"exact": 0.25, "short": 0.625}


def test_a_verdict_without_a_reward_per_rollout_is_not_usable() -> None:
    prompts, body, _ = group_columns([0.0] * 4)
    assert verdict_rewards(None, 4) is None
    assert verdict_rewards(Verdict(submission_id="s", accepted=True).model_dump_json(), 4) is None
    with pytest.raises(ValueError, match="no validator reward"):
        accepted_group(
            "s", 0, prompts, body, Verdict(submission_id="s", accepted=True, rewards=[1.0]).model_dump_json()
        )


def test_version_floor_and_lease_room() -> None:
    assert [min_policy_version(step, 0) for step in (1, 2, 5)] == [0, 1, 4]
    assert [min_policy_version(step, 2) for step in (1, 2, 5)] == [0, 0, 2]
    assert lease_room(0, groups_per_step=4, groups_in_flight=0) == 4
    assert lease_room(0, groups_per_step=4, groups_in_flight=3) == 1
    assert lease_room(0, groups_per_step=4, groups_in_flight=6) == 0
    assert lease_room(2, groups_per_step=4, groups_in_flight=6) == 6
    assert lease_room(2, groups_per_step=4, groups_in_flight=13) == 0
    # steps_ahead narrows the window (one step: the next batch while the current one trains), never widens it
    assert lease_room(2, groups_per_step=4, groups_in_flight=3, steps_ahead=1) == 1
    assert lease_room(2, groups_per_step=4, groups_in_flight=4, steps_ahead=1) == 0
    assert lease_room(1, groups_per_step=4, groups_in_flight=4, steps_ahead=5) == 4
    assert lease_room(0, groups_per_step=4, groups_in_flight=0, steps_ahead=3) == 4


def test_batch_files_round_trip_and_appear_whole(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path)
    assert train_dir.read_batch(1) is None and train_dir.read_done(1) is None
    samples = [TrainSample([1, 2], [3], advantage=0.5, inference_logprobs=[-0.25], reward=1.0)]
    train_dir.write_batch(StepBatch(1, samples, 0.7, ["s-1"]))
    assert train_dir.read_batch(1) == StepBatch(1, samples, 0.7, ["s-1"])
    assert [p.name for p in (tmp_path / "batches").iterdir()] == ["step_1.safetensors"]  # no temporary left behind
    train_dir.write_done(1, {"loss": 0.1})
    assert train_dir.read_done(1) == {"loss": 0.1}


def finished_group(endings: list[tuple[int, str]]) -> AcceptedGroup:
    """One accepted group whose rollouts have the given (number of tokens, finish reason)."""
    rollouts = [
        Rollout(
            prompt_index=0,
            sample_index=i,
            completion_ids=[7] * num_tokens,
            logprobs=[-0.5] * num_tokens,
            finish_reason=reason,
            proof_b64="AAAA",
        )
        for i, (num_tokens, reason) in enumerate(endings)
    ]
    body = SubmitRequest(lease_id="l", task_id="t", policy_version=0, engine="hf", rollouts=rollouts)
    verdict = Verdict(submission_id="s", accepted=True, rewards=[0.5] * len(rollouts))
    prompts = json.dumps([{"prompt_index": 0, "token_ids": [1]}])
    return accepted_group("s", 0, prompts, body.model_dump_json(), verdict.model_dump_json())


def test_rollout_stats_say_how_long_the_completions_are_and_how_they_ended() -> None:
    stopped = finished_group([(3, "stop"), (5, "stop"), (16, "length")])
    cut = finished_group([(16, "length")])
    stats = rollout_stats([stopped, cut])
    assert stats["completion_tokens_mean"] == pytest.approx((3 + 5 + 16 + 16) / 4)
    assert stats["stop_fraction"] == pytest.approx(0.5)
    assert stats["truncated_fraction"] == pytest.approx(0.5)
    assert stats["turns_mean"] == 1.0
    assert set(rollout_stats([]).values()) == {0.0}
    summary = batch_summary([stopped, cut], trained_version=0)
    assert {k: summary[k] for k in stats} == stats  # the step's metrics carry them (as batch_*)


def test_a_policy_that_never_emits_eos_shows_as_truncated() -> None:
    # what a reward-hacking policy that pads to the budget produces: every rollout cut at max_tokens
    padding = [finished_group([(16, "length")] * 8) for _ in range(4)]
    stats = rollout_stats(padding)
    assert stats == {"completion_tokens_mean": 16.0, "turns_mean": 1.0, "stop_fraction": 0.0, "truncated_fraction": 1.0}


def test_step_figures_are_read_defensively() -> None:
    metrics = {"a": 1, "b": True, "c": "1", "d": float("nan"), "e": 0.25}
    assert [step_figure(metrics, k) for k in "abcdef"] == [1.0, None, None, None, 0.25, None]
    assert step_figure(["a"], "a") is None


def image_group(pins: list[list[str]]) -> AcceptedGroup:
    """The group of :func:`group_columns`, its two prompts being count_shapes examples 7 and 8 pinning ``pins``."""
    prompts, body, verdict = group_columns([0.9, 0.4, 0.1, 0.0])
    stored = json.loads(prompts)
    for prompt, example, pinned in zip(stored, (7, 8), pins, strict=True):
        prompt.update(example_index=example, image_sha256=pinned)
    return accepted_group("s", 3, json.dumps(stored), body, verdict)


def test_each_sample_shows_its_prompts_images_rendered_on_the_trusted_side() -> None:
    from environments.builtin import builtin_environment
    from environments.images import image_hashes

    environment = builtin_environment("count_shapes")
    pins = [list(image_hashes(environment.example(i).images)) for i in (7, 8)]
    group = image_group(pins)
    samples = train_samples([group], images=rendered_images(environment))
    assert [list(image_hashes(s.images)) for s in samples] == [pins[0], pins[0], pins[1], pins[1]]
    with pytest.raises(ValueError, match="pins images in a text run"):
        train_samples([group])
    with pytest.raises(ValueError, match="submission s, prompt 1: example 8 renders"):
        train_samples([image_group([pins[0], pins[0]])], images=rendered_images(environment))
