"""Multi-turn episodes through the real network: `prime-coordinator start` with a multi-turn environment of each
adapter (the built-in calculator, a tool the policy calls; a Python class; a verifiers v0 MultiTurnEnv), a
worker that plays episodes, a validator that replays them, and the trainer learning from them.

Each run trains on episodes whose every reward the test recomputes here by replaying the environment, and its
metrics show episodes of more than one policy turn and a loss on the sampled tokens only. Against a network
serving the same task, a worker that cheats at episodes is refused at the door or rejected by the validator
with the reason: a tampered tool reply, the tool's tokens passed off as sampled and sampled tokens passed off
as the tool's, an episode stopped early or played past its end or past the run's turn limit, and a mask
declared by the worker.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter
from sqlalchemy import select

from coordinator.ledger.storage.tables import submissions, tasks
from engines.hf import HFEngine
from environments.base import ChatMessage, Example
from environments.builtin.calculator import Calculator
from environments.config import EnvironmentConfig
from environments.episode import MultiTurnEnvironment, episode_scores, rebuild_episode
from environments.loader import load_environment
from node.startup import eos_token_ids
from protocol.errors import PrimeError
from protocol.identity import NodeIdentity
from protocol.ledger_client import LedgerClient
from protocol.schemas import Hardware, LeaseRequest, RegisterRequest, Rollout, SubmitRequest, Task
from tests.integration.test_environments_network import TASKSETS_DIR
from tests.support.malicious_worker import signed_post
from tests.support.network import ledger_rows, running_network, train_through_local_network
from worker.episodes import EpisodePlayer, build_episode_submission

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

START = "builtin:small-qwen3-calculator-start"
CALCULATOR = {"type": "builtin", "name": "calculator"}
NUM_STEPS = 2


def start_checkpoint() -> Path:
    from trainer.resolve import resolve_model_path

    return resolve_model_path(START)


def episodes_of(root: Path) -> list[tuple[dict[int, dict[str, Any]], SubmitRequest, dict[str, Any], str]]:
    """(task prompts by index, submission, verdict, status) of every decided submission in the run's ledger."""
    prompts = {row.task_id: json.loads(row.prompts_json) for row in ledger_rows(root, select(tasks))}
    return [
        (
            {p["prompt_index"]: p for p in prompts[row.task_id]},
            SubmitRequest.model_validate_json(row.body_json),
            json.loads(row.verdict_json or "{}"),
            row.status,
        )
        for row in ledger_rows(root, select(submissions))
        if row.status in ("accepted", "rejected")
    ]


COUNTING: dict[str, Any] = {"type": "python", "target": "tests.support.episodes:Counting", "episode": {"max_turns": 3}}
ADAPTERS: dict[str, tuple[dict[str, Any], str, int]] = {
    "builtin": (CALCULATOR, "calculator", 4),
    "python": (COUNTING, "counting", 3),
    "verifiers": ({"type": "verifiers", "api": "v0", "taskset": "vf0-guess-env"}, "vf0-guess-env", 4),
}
"""A multi-turn environment of each adapter: the built-in calculator, a Python class that always replies (until its
3-turn limit), and a verifiers v0 MultiTurnEnv (a guessing game with its own stop conditions)."""


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_run_trains_on_episodes_the_validator_replayed(tmp_path: Path, adapter: str) -> None:
    section, name, max_turns = ADAPTERS[adapter]
    checkpoint = start_checkpoint()
    where = [TASKSETS_DIR]
    train_through_local_network(tmp_path, f"episodes-{adapter}", section, str(checkpoint), NUM_STEPS, 24, where)
    worker_log = (tmp_path / "run" / "network" / "worker-hf.log").read_text()
    assert f"run episodes: up to {max_turns} policy turns with {name}" in worker_log

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    eos = eos_token_ids(checkpoint)
    sys.path.insert(0, str(TASKSETS_DIR))
    try:
        environment = load_environment(TypeAdapter(EnvironmentConfig).validate_python(section))
    finally:
        sys.path.remove(str(TASKSETS_DIR))
    assert isinstance(environment, MultiTurnEnvironment)
    decided = episodes_of(tmp_path)
    accepted = [(p, s, v) for p, s, v, status in decided if status == "accepted"]
    assert len(accepted) >= NUM_STEPS
    turns_seen = 0
    for prompts, submission, verdict in accepted:
        for position, rollout in enumerate(submission.rollouts):
            turn_ids = [rollout.completion_ids, *(turn.completion_ids for turn in rollout.later_turns)]
            example = environment.example(prompts[rollout.prompt_index]["example_index"])
            episode, _ = rebuild_episode(environment, example, turn_ids, tokenizer, eos)
            assert verdict["rewards"][position] == pytest.approx(episode_scores(environment, episode).total)
            turns_seen = max(turns_seen, len(turn_ids))
    assert turns_seen >= 2, "no episode went past its first turn"

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "step"]
    assert [row["step"] for row in steps] == list(range(1, NUM_STEPS + 1))
    for row in steps:
        assert row["batch_turns_mean"] > 1.0, row  # the environment answered the policy
        assert 0.0 < row["batch_sampled_fraction"] < 1.0, row  # its replies are in the samples, untrained
        assert row["loss"] == row["loss"]


class OffByOne(Calculator):
    """The calculator as a cheat would have it: every answer one more."""

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        reply = super().reply(example, transcript)
        if reply is None or not reply[0].content.startswith("= "):
            return reply
        return (ChatMessage("tool", f"= {int(reply[0].content[2:]) + 1}"),)


def replaced(submission: SubmitRequest, position: int, rollout: Rollout) -> SubmitRequest:
    rollouts = list(submission.rollouts)
    rollouts[position] = rollout
    return submission.model_copy(update={"rollouts": rollouts})


def folded(submission: SubmitRequest, task: Task, tokenizer: Any, eos: tuple[int, ...], position: int) -> SubmitRequest:
    """Turn 0, the tool's reply and turn 1 sent as one turn, as if the policy had sampled all of it."""
    rollout = submission.rollouts[position]
    environment = Calculator(seed=0)
    prompt = next(p for p in task.prompts if p.prompt_index == rollout.prompt_index)
    example = environment.example(prompt.example_index or 0)
    turn_ids = [rollout.completion_ids, *(turn.completion_ids for turn in rollout.later_turns)]
    _episode, prompts = rebuild_episode(environment, example, turn_ids, tokenizer, eos)
    between = prompts[1][len(prompts[0]) + len(rollout.completion_ids) :]
    second = rollout.later_turns[0]
    cheat = rollout.model_copy(
        update={
            "completion_ids": [*rollout.completion_ids, *between, *second.completion_ids],
            "logprobs": [*rollout.logprobs, *([-0.01] * len(between)), *second.logprobs],
            "finish_reason": second.finish_reason,
            "proof_b64": second.proof_b64,
            "later_turns": rollout.later_turns[1:],
        }
    )
    return replaced(submission, position, cheat)


async def cheat_at_episodes(url: str, checkpoint: Path) -> dict[str, tuple[int | None, str]]:
    """Each cheat on a freshly leased task: (door status, reason) when refused, else (None, submission id)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    engine = HFEngine(checkpoint, max_batch_size=16)
    eos = eos_token_ids(checkpoint)
    honest_player = EpisodePlayer(Calculator(seed=0), tokenizer)
    outcomes: dict[str, tuple[int | None, str]] = {}
    identity = NodeIdentity.generate()
    async with LedgerClient(url, identity) as ledger:
        hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=2**30)
        await ledger.register(RegisterRequest(role="worker", hardware=hardware, engine="hf", software_version="evil"))

        async def lease() -> Task:
            while True:
                leased = await ledger.lease(LeaseRequest(max_tasks=1, policy_versions_held=[0]))
                if leased.tasks:
                    return leased.tasks[0]
                await asyncio.sleep(0.2)

        async def submit(name: str, request: SubmitRequest) -> None:
            try:
                outcomes[name] = (None, (await ledger.submit(request)).submission_id)
            except PrimeError as exc:
                outcomes[name] = (exc.status_code, exc.message)

        def play(task: Task, player: EpisodePlayer = honest_player) -> SubmitRequest:
            return build_episode_submission(task, engine.name, player.play(engine.generate, task, eos))

        task = await lease()
        await submit("honest_control", play(task))

        task = await lease()
        await submit("tampered_tool_reply", play(task, EpisodePlayer(OffByOne(seed=0), tokenizer)))

        async def two_turn_episode(min_second_turn_tokens: int = 1) -> tuple[Task, SubmitRequest, int, Rollout]:
            """An honestly played task, and a rollout of it that called the tool (and its position) whose second
            turn sampled at least ``min_second_turn_tokens`` tokens (another task is played until one does)."""
            while True:
                task = await lease()
                honest = play(task)
                found = [
                    i
                    for i, r in enumerate(honest.rollouts)
                    if r.later_turns and len(r.later_turns[0].completion_ids) >= min_second_turn_tokens
                ]
                if found:
                    return task, honest, found[0], honest.rollouts[found[0]]
                await ledger.abandon(task.lease_id)  # a node holds few leases: give this one back

        task, honest, position, rollout = await two_turn_episode()
        await submit("tool_tokens_claimed_as_sampled", folded(honest, task, tokenizer, eos, position))

        # a second turn of at least 3 tokens: with 2 or fewer the cheat below leaves it empty, refused at the door
        _task, honest, position, rollout = await two_turn_episode(min_second_turn_tokens=3)
        second = rollout.later_turns[0]
        shortened = second.model_copy(
            update={"completion_ids": second.completion_ids[2:], "logprobs": second.logprobs[2:]}
        )  # its first two sampled tokens passed off as the environment's
        cheat = rollout.model_copy(update={"later_turns": [shortened]})
        await submit("sampled_tokens_claimed_as_the_tools", replaced(honest, position, cheat))

        _task, honest, position, rollout = await two_turn_episode()
        early = rollout.model_copy(update={"later_turns": []})
        await submit("stopped_early", replaced(honest, position, early))

        _task, honest, position, rollout = await two_turn_episode()
        extra = rollout.model_copy(update={"later_turns": [*rollout.later_turns, rollout.later_turns[-1]]})
        await submit("played_past_its_end", replaced(honest, position, extra))  # a turn after the answer

        task, honest, position, rollout = await two_turn_episode()
        past_limit = rollout.model_copy(update={"later_turns": [rollout.later_turns[-1]] * 4})
        await submit("past_the_turn_limit", replaced(honest, position, past_limit))
        document = honest.model_dump(mode="json")
        document["rollouts"][position]["later_turns"][0]["sampled_mask"] = [1] * len(
            rollout.later_turns[0].completion_ids
        )
        response = await signed_post(url, identity, "/v1/submissions", document)
        outcomes["declared_mask"] = (response.status_code, response.text[:300])
        await ledger.abandon(task.lease_id)  # both refused at the door: the lease is still this node's
    engine.close()
    return outcomes


REJECTED_BY = {
    "tampered_tool_reply": "turn 1: toploc:",
    "tool_tokens_claimed_as_sampled": "rollout p",
    "sampled_tokens_claimed_as_the_tools": "turn 1: ",
    "stopped_early": "episode: the episode stops after policy turn 1, but the environment replied",
    "played_past_its_end": "episode: the environment ended the episode after policy turn 2 of 3",
}
"""The reason each cheat that passes the door is rejected with."""
REFUSED_BY = {
    "past_the_turn_limit": "5 policy turns, but this run's episodes have at most 4",
    "declared_mask": "sampled_mask",
}
"""The reason each cheat the ledger refuses at the door (400) names."""


def test_cheats_at_episodes_are_refused_or_rejected_with_their_reason(tmp_path: Path) -> None:
    checkpoint = start_checkpoint()
    sections = {"trust": {"ban_after_rejections": 100}, "scheduling": {"max_tokens": 48, "lease_ttl_s": 300}}
    with running_network(tmp_path, [checkpoint], environment=CALCULATOR, sections=sections) as net:
        validator = net.start_validator()
        outcomes = asyncio.run(cheat_at_episodes(net.url, checkpoint))
        assert set(outcomes) == {"honest_control", *REJECTED_BY, *REFUSED_BY}
        for name, reason in REFUSED_BY.items():
            status, message = outcomes[name]
            assert status == 400 and reason in message, (name, outcomes[name])
        judged = {name: outcomes[name][1] for name in ("honest_control", *REJECTED_BY)}
        for name, (status, _) in outcomes.items():
            assert name in REFUSED_BY or status is None, (name, outcomes[name])
        net.expect_verdicts(judged, REJECTED_BY)
        assert validator.poll() is None, net.worker_log("validator")
        assert httpx.get(f"{net.url}/v1/run-spec", timeout=5).json()["spec"]["max_turns"] == 4
