"""The HF engine with a vision-language policy: it generates from a prompt's images, a prefill with the same images
recomputes the rows the proofs commit to, another image does not, and a prompt that misplaces images is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.base import GenerationRequest
from engines.hf import HFEngine
from environments.builtin import builtin_environment
from environments.prompts import EnvironmentPrompts
from tests.support.tiny_model import save_tiny_qwen2
from trainer.builtin import build_tiny_qwen2_vl


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vl") / "tiny-qwen2-vl"
    path.mkdir()
    build_tiny_qwen2_vl(path)
    return path


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> HFEngine:
    return HFEngine(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _requests(engine: HFEngine, tokenizer: Any, indices: list[int], max_tokens: int = 6) -> list[GenerationRequest]:
    environment = builtin_environment("count_shapes")
    source = EnvironmentPrompts(environment, tokenizer, engine.vision)
    requests = []
    for index in indices:
        (prompt,) = source.prompt_group(index, 1)
        example = environment.example(index)
        assert [image.sha256 for image in example.images] == list(prompt.image_sha256)
        requests.append(
            GenerationRequest(
                uid=f"r{index}",
                prompt_ids=list(prompt.token_ids),
                max_tokens=max_tokens,
                temperature=1.0,
                seed=11,
                stream=index,
                images=example.images,
            )
        )
    return requests


def test_prefill_with_the_same_images_recomputes_the_generated_rows(engine: HFEngine, tokenizer: Any) -> None:
    requests = _requests(engine, tokenizer, [0, 1, 2])
    results = engine.generate(requests)
    prefilled = engine.prefill(
        [r.prompt_ids for r in requests], [g.completion_ids for g in results], images=[r.images for r in requests]
    )
    for request, result, again in zip(requests, results, prefilled, strict=True):
        torch.testing.assert_close(again.hidden_states, result.hidden_states, atol=1e-4, rtol=1e-4)
        logprobs = torch.log_softmax(again.logits / request.temperature, -1)
        chosen = logprobs.gather(1, torch.tensor(result.completion_ids).reshape(-1, 1)).reshape(-1)
        torch.testing.assert_close(chosen, torch.tensor(result.logprobs), atol=1e-4, rtol=1e-4)


def test_another_image_gives_other_rows(engine: HFEngine, tokenizer: Any) -> None:
    first, second = _requests(engine, tokenizer, [0, 1])
    (result,) = engine.generate([first])
    own, swapped = engine.prefill(
        [first.prompt_ids, first.prompt_ids], [result.completion_ids] * 2, images=[first.images, second.images]
    )
    assert (own.hidden_states - swapped.hidden_states).abs().max() > 1e-3


def test_a_batch_draws_what_each_request_draws_alone(engine: HFEngine, tokenizer: Any) -> None:
    requests = _requests(engine, tokenizer, [3, 4, 5])
    together = engine.generate(requests)
    for request, result in zip(requests, together, strict=True):
        (alone,) = engine.generate([request])
        assert alone.completion_ids == result.completion_ids
        torch.testing.assert_close(alone.hidden_states, result.hidden_states, atol=1e-4, rtol=1e-4)


def test_a_prompt_that_misplaces_its_images_is_refused(engine: HFEngine, tokenizer: Any, tmp_path: Path) -> None:
    (request,) = _requests(engine, tokenizer, [0])
    two = GenerationRequest(**{**request.__dict__, "images": request.images * 2})
    with pytest.raises(ValueError, match="image tokens"):
        engine.generate([two])
    none = GenerationRequest(**{**request.__dict__, "images": ()})
    with pytest.raises(ValueError, match="no images were given"):
        engine.generate([none])
    text_engine = HFEngine(save_tiny_qwen2(tmp_path / "text"))
    with pytest.raises(ValueError, match="reads text only"):
        text_engine.prefill([[1, 2]], [[3]], images=[request.images])


def test_weights_reload_in_place(engine: HFEngine, model_dir: Path, tokenizer: Any) -> None:
    (request,) = _requests(engine, tokenizer, [6])
    (before,) = engine.generate([request])
    engine.load_weights(model_dir)
    (after,) = engine.generate([request])
    assert after.completion_ids == before.completion_ids


def test_the_policy_never_draws_a_token_that_holds_an_images_place(engine: HFEngine, tokenizer: Any) -> None:
    from engines.vision import NEVER_DRAWN_LOGIT

    assert engine.vision is not None
    never = list(engine.vision.never_drawn_ids)
    assert engine.vision.image_token_id in never and len(never) == 4
    logits = engine._logits(torch.randn(3, engine.model.config.get_text_config().hidden_size))
    assert torch.all(logits[:, never] == NEVER_DRAWN_LOGIT)
    # Hot sampling from random weights draws about uniformly from 516 tokens: without the rule, about 6 of these
    # 768 would be vision tokens (none with odds of e^-6).
    requests = [replace(r, temperature=4.0, max_tokens=48) for r in _requests(engine, tokenizer, list(range(16)))]
    drawn = [token for result in engine.generate(requests) for token in result.completion_ids]
    assert len(drawn) == 16 * 48
    assert not set(drawn) & set(never)
