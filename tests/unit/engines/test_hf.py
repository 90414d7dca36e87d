"""HF engine: verifiable draws, row alignment with prefill, batching invariance, termination, reload."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.base import GenerationRequest
from engines.hf import HFEngine
from tests.support.tiny_model import TINY_EOS_TOKEN_ID, save_tiny_qwen2
from toploc.sampling import sample_stream, sampling_gaps


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> HFEngine:
    return HFEngine(model_dir, max_batch_size=8)


def _requests(num: int, max_tokens: int = 24, temperature: float = 1.0, seed: int = 7) -> list[GenerationRequest]:
    generator = torch.Generator().manual_seed(num * 1000 + max_tokens)
    requests = []
    for i in range(num):
        length = int(torch.randint(2, 12, (1,), generator=generator))
        prompt = torch.randint(2, 1024, (length,), generator=generator).tolist()
        requests.append(
            GenerationRequest(
                uid=f"r{i}",
                prompt_ids=prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                stream=sample_stream(i // 2, i % 2),
                eos_token_ids=(TINY_EOS_TOKEN_ID,),
            )
        )
    return requests


def test_results_keep_request_order_and_shapes(engine: HFEngine) -> None:
    requests = _requests(11)
    results = engine.generate(requests)
    assert [r.uid for r in results] == [r.uid for r in requests]
    for result in results:
        num_tokens = len(result.completion_ids)
        assert 1 <= num_tokens <= 24
        assert len(result.logprobs) == num_tokens
        assert result.hidden_states.shape == (num_tokens, 64)
        assert result.hidden_states.dtype == torch.float32
        assert all(lp <= 0.0 for lp in result.logprobs)


def test_termination_at_eos_or_max_tokens(engine: HFEngine) -> None:
    results = engine.generate(_requests(16, max_tokens=40))
    reasons = {r.finish_reason for r in results}
    assert reasons == {"stop", "length"}, "the tiny model should end some completions at EOS and run others out"
    for result in results:
        eos_positions = [i for i, t in enumerate(result.completion_ids) if t == TINY_EOS_TOKEN_ID]
        if result.finish_reason == "stop":
            assert eos_positions == [len(result.completion_ids) - 1]
        else:
            assert eos_positions == [] and len(result.completion_ids) == 40


def test_batching_and_padding_do_not_change_draws(engine: HFEngine) -> None:
    requests = _requests(6)
    together = engine.generate(requests)
    alone = [engine.generate([request])[0] for request in requests]
    for a, b in zip(together, alone, strict=True):
        assert a.completion_ids == b.completion_ids
        assert torch.allclose(a.hidden_states, b.hidden_states, atol=1e-5)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_mixed_seeds_and_temperatures_in_one_batch(engine: HFEngine) -> None:
    mixed = _requests(2, temperature=0.7, seed=1) + _requests(2, temperature=1.3, seed=2)
    mixed = [GenerationRequest(**{**r.__dict__, "uid": f"m{i}"}) for i, r in enumerate(mixed)]
    together = engine.generate(mixed)
    for request, result in zip(mixed, together, strict=True):
        assert engine.generate([request])[0].completion_ids == result.completion_ids


def test_prefill_recomputes_generation_rows(engine: HFEngine) -> None:
    requests = _requests(8, max_tokens=32)
    results = engine.generate(requests)
    prefills = engine.prefill([r.prompt_ids for r in requests], [g.completion_ids for g in results])
    for request, result, prefill in zip(requests, results, prefills, strict=True):
        num_tokens = len(result.completion_ids)
        assert prefill.hidden_states.shape == (num_tokens, 64)
        assert prefill.logits.shape == (num_tokens, engine.vocab_size)
        assert prefill.logits.dtype == torch.float32
        assert torch.allclose(prefill.hidden_states, result.hidden_states, atol=1e-5)
        tokens = torch.tensor(result.completion_ids)
        recomputed = torch.log_softmax(prefill.logits / request.temperature, -1).gather(1, tokens[:, None])[:, 0]
        assert torch.allclose(recomputed, torch.tensor(result.logprobs), atol=1e-5)
        gaps = sampling_gaps(prefill.logits, request.temperature, request.seed, request.stream, tokens)
        assert float(gaps.max()) < 1e-4, "every token must be the noisy argmax of the recomputed logits"


def test_decoder_output_is_the_final_norm_state(engine: HFEngine) -> None:
    ids = torch.tensor([[5, 17, 300, 2, 9]])
    captured: list[torch.Tensor] = []
    handle = engine.model.model.norm.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        with torch.no_grad():
            full = engine.model(ids, output_hidden_states=True)
    finally:
        handle.remove()
    prefill = engine.prefill([[5, 17]], [[300, 2, 9]])[0]
    assert torch.equal(full.hidden_states[-1], captured[0])
    assert torch.allclose(prefill.hidden_states, captured[0][0, 1:4], atol=1e-6)
    assert torch.allclose(prefill.logits, full.logits[0, 1:4], atol=1e-5)


def test_load_weights_in_place(model_dir: Path, tmp_path: Path) -> None:
    other_dir = save_tiny_qwen2(tmp_path / "other", seed=1)
    requests = _requests(3)
    engine = HFEngine(model_dir)
    weight = engine.model.get_output_embeddings().weight
    engine.load_weights(other_dir)
    assert engine.model.get_output_embeddings().weight is weight, "reload must not reallocate"
    reloaded = engine.generate(requests)
    fresh = HFEngine(other_dir).generate(requests)
    assert [r.completion_ids for r in reloaded] == [r.completion_ids for r in fresh]
    with pytest.raises(FileNotFoundError):
        engine.load_weights(tmp_path / "missing")


def test_load_weights_refuses_another_architecture(model_dir: Path, tmp_path: Path) -> None:
    from tests.support.tiny_model import TinyModelSpec

    wide = save_tiny_qwen2(tmp_path / "wide", spec=TinyModelSpec(hidden_size=96, intermediate_size=128))
    engine = HFEngine(model_dir)
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights(wide)


def test_bad_requests_are_refused_clearly(engine: HFEngine) -> None:
    good = _requests(1)[0]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([GenerationRequest(**{**good.__dict__, "prompt_ids": [5, 4096]})])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([GenerationRequest(**{**good.__dict__, "prompt_ids": []})])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.prefill([[1, 2]], [[3, -1]])
    with pytest.raises(ValueError, match="prompts but"):
        engine.prefill([[1, 2]], [])
