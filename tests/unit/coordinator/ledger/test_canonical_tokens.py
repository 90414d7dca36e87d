"""One token array per rollout, from the worker's signature to the trainer's loss: property-based.

What the trainer learns from is built only from the ledger's task (its prompt tokens) and the
completion ids the worker signed and the validators checked: the batch a step records, the batch file
the trainer reads and the micro-batches it computes the loss on hold exactly prompt + completion, with
the loss mask (the prompt/completion split) covering the completion and nothing else, whatever order
the rollouts came in. A submission cannot carry a second copy of the tokens, a mask or a split: any
field the schema does not name is refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coordinator.ledger.batches import accepted_group, train_samples
from protocol.schemas import Rollout, SubmitRequest, Verdict
from trainer.packing import make_micro_batches
from trainer.transport import StepBatch, decode_batch, encode_batch

tokens = st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=6)


@st.composite
def accepted_rows(draw: st.DrawFn) -> tuple[str, str, str]:
    """(prompts_json as the ledger stores a task's prompts, a submission body, a verdict) of one group."""
    num_prompts = draw(st.integers(min_value=1, max_value=3))
    group_size = draw(st.integers(min_value=1, max_value=3))
    prompts = [
        {"prompt_index": i, "token_ids": draw(tokens), "text": draw(st.text(max_size=8)), "example_index": i}
        for i in range(num_prompts)
    ]
    rollouts = []
    for prompt_index in range(num_prompts):
        for sample_index in range(group_size):
            completion = draw(tokens)
            logprobs = draw(st.lists(st.floats(-5, 0), min_size=len(completion), max_size=len(completion)))
            rollouts.append(
                Rollout(
                    prompt_index=prompt_index,
                    sample_index=sample_index,
                    completion_ids=completion,
                    logprobs=logprobs,
                    finish_reason="length",
                    proof_b64="",
                )
            )
    rollouts = draw(st.permutations(rollouts))
    body = SubmitRequest(lease_id="l-1", task_id="t0", policy_version=0, engine="hf", rollouts=rollouts)
    rewards = draw(st.lists(st.floats(0, 1), min_size=len(rollouts), max_size=len(rollouts)))
    verdict = Verdict(submission_id="s-1", accepted=True, rewards=rewards)
    return json.dumps(prompts), body.model_dump_json(), verdict.model_dump_json()


@settings(max_examples=60, deadline=None)
@given(accepted_rows(), st.booleans())
def test_the_trainer_learns_from_the_ledgers_prompt_and_the_signed_completion(
    rows: tuple[str, str, str], packed: bool
) -> None:
    prompts_json, body_json, verdict_json = rows
    group = accepted_group("s-1", 0, prompts_json, body_json, verdict_json)
    prompts = {p["prompt_index"]: p["token_ids"] for p in json.loads(prompts_json)}
    signed = SubmitRequest.model_validate_json(body_json).rollouts
    expected = sorted((prompts[r.prompt_index], r.completion_ids, r.logprobs) for r in signed)

    samples = decode_batch(encode_batch(StepBatch(1, train_samples([group]), 1.0, ["s-1"]))).samples
    assert sorted((s.prompt_ids, s.completion_ids, s.inference_logprobs) for s in samples) == expected

    micro_batches = make_micro_batches(samples, micro_batch_tokens=64, packed=packed)
    trained: list[int] = []
    for micro in micro_batches:
        assert micro.loss_mask.sum() == sum(len(samples[i].completion_ids) for i in micro.sample_ids)
        trained += micro.targets[micro.loss_mask].tolist()
        if not packed:  # one sample a row: its tokens, and its loss on exactly its completion
            for row, index in enumerate(micro.sample_ids):
                sample = samples[index]
                length = sample.num_tokens
                assert micro.input_ids[row, :length].tolist() == sample.prompt_ids + sample.completion_ids
                assert micro.targets[row][micro.loss_mask[row]].tolist() == sample.completion_ids
    assert sorted(trained) == sorted(t for _prompt, completion, _lps in expected for t in completion)


DECLARED = ["text", "prompt_ids", "loss_mask", "completion_mask", "num_prompt_tokens", "prompt_lengths", "reward"]


@settings(max_examples=80, deadline=None)
@given(st.one_of(st.sampled_from(DECLARED), st.from_regex(r"[a-z][a-z_]{0,19}", fullmatch=True)), st.booleans())
def test_a_worker_cannot_declare_tokens_masks_or_splits(name: str, on_rollout: bool) -> None:
    model: Any = Rollout if on_rollout else SubmitRequest
    if name in model.model_fields:
        return
    rollout = {"prompt_index": 0, "sample_index": 0, "completion_ids": [5], "logprobs": [-1.0]}
    document: dict[str, Any] = {"lease_id": "l", "task_id": "t", "policy_version": 0, "engine": "hf"}
    document["rollouts"] = [{**rollout, "finish_reason": "length", "proof_b64": ""}]
    target = document["rollouts"][0] if on_rollout else document
    target[name] = [0]
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SubmitRequest.model_validate(document)
