"""The HF engine, TOPLOC and the validator on every architecture of the matrix (CPU, float32).

Per architecture: the engine's captured rows are the model's own final-norm states and its
draws replay by prefill; an honest submission built from them (TOPLOC proofs included) passes the
validator's audit, and the same rollouts checked against another init are rejected; weights
reload in place (tied heads and Qwen3-MoE's per-expert checkpoint files included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.hf import HFEngine
from tests.integration.architectures.conftest import EOS, ledger_task, pending, sample_tasks
from tests.support.adversary import generation_request, honest_claims
from tests.support.tiny_model import ARCHITECTURES
from toploc.sampling import sampling_gaps
from validator.audit import audit_submission

EXPECTED_CLASSES = {
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen2_tied": ("Qwen2ForCausalLM", True),
    "qwen3": ("Qwen3ForCausalLM", True),
    "llama3": ("LlamaForCausalLM", False),
    "qwen3_moe": ("Qwen3MoeForCausalLM", False),
}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_honest_rollouts_pass_the_validator_and_another_init_fails(
    architecture: str, matrix_models: dict[str, tuple[Path, Path]]
) -> None:
    policy_dir, other_dir = matrix_models[architecture]
    worker = HFEngine(policy_dir, max_batch_size=8)
    name, tied = EXPECTED_CLASSES[architecture]
    assert type(worker.model).__name__ == name
    assert (worker.model.get_output_embeddings().weight is worker.model.get_input_embeddings().weight) == tied

    task = ledger_task()
    tasks = sample_tasks(task)
    claims = honest_claims(worker, tasks)
    assert {c.finish_reason for c in claims} <= {"stop", "length"} and all(c.completion_ids for c in claims)

    # The captured rows are the model's own final-norm states (output_hidden_states[-1]) that drew each token.
    first = claims[0]
    generated = worker.generate([generation_request(tasks[0], 0)])[0]
    ids = torch.tensor([first.task.prompt_ids + first.completion_ids])
    with torch.no_grad():
        out = worker.model(ids, output_hidden_states=True)
    start, n = len(first.task.prompt_ids) - 1, len(first.completion_ids)
    torch.testing.assert_close(generated.hidden_states, out.hidden_states[-1][0, start : start + n], atol=1e-4, rtol=0)
    logits = out.logits[0, start : start + n]
    gaps = sampling_gaps(logits, 1.0, task.sampling_seed, first.task.stream, ids[0, start + 1 :])
    assert float(gaps.max()) < 1e-4

    validator = HFEngine(policy_dir, max_batch_size=8)
    verdict, rollouts = audit_submission(pending(task, claims), validator, EOS)
    assert verdict.accepted, verdict.reasons
    assert len(rollouts) == len(claims)

    impostor = HFEngine(other_dir, max_batch_size=8)
    verdict, _ = audit_submission(pending(task, claims), impostor, EOS)
    assert not verdict.accepted


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_weights_reload_in_place(architecture: str, matrix_models: dict[str, tuple[Path, Path]]) -> None:
    policy_dir, other_dir = matrix_models[architecture]
    requests = [generation_request(t, i) for i, t in enumerate(sample_tasks(ledger_task()))]
    engine = HFEngine(policy_dir, max_batch_size=8)
    parameters = {name: p.data_ptr() for name, p in engine.model.named_parameters()}
    before = engine.generate(requests)
    for checkpoint in (other_dir, policy_dir, other_dir):
        engine.load_weights(checkpoint)
        fresh = HFEngine(checkpoint, max_batch_size=8).generate(requests)
        reloaded = engine.generate(requests)
        assert [r.completion_ids for r in reloaded] == [r.completion_ids for r in fresh]
        for got, want in zip(reloaded, fresh, strict=True):
            torch.testing.assert_close(got.hidden_states, want.hidden_states, atol=1e-5, rtol=0)
    assert [r.completion_ids for r in reloaded] != [r.completion_ids for r in before]
    assert {name: p.data_ptr() for name, p in engine.model.named_parameters()} == parameters, "reload reallocated"
