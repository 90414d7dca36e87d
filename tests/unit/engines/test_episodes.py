"""Multi-turn episodes played with a real HF engine: the trusted side rebuilds every prompt and reply from the
sampled tokens alone, and each turn's draw verifies on its own noise stream (and on no other)."""

from __future__ import annotations

from typing import Any

import pytest

from engines.episodes import EpisodeRequest, play_episodes
from engines.hf import HFEngine
from environments.config import EpisodeLimits
from environments.episode import episode_samples, policy_turn, replay, turn_prompt_ids
from protocol.schemas import SamplingParams
from tests.support.episodes import Counting, chat_policy
from toploc.proof import build_proofs
from toploc.sampling import turn_stream
from toploc.verify import verify_rollout

LIMITS = EpisodeLimits(max_turns=3)
SAMPLING = SamplingParams(temperature=1.0, max_tokens=6)
SEED = 1234


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[HFEngine, Any]:
    return chat_policy(tmp_path_factory.mktemp("chat-policy"))


def test_played_episodes_are_rebuilt_and_verified_turn_by_turn(policy: tuple[HFEngine, Any]) -> None:
    engine, tokenizer = policy
    env = Counting(limits=LIMITS)
    eos = (tokenizer.convert_tokens_to_ids("<|im_end|>"), 1)  # the tiny model's biased id ends turns too
    requests = [EpisodeRequest(f"t/{p}/{s}", env.example(10 + p), p, s) for p in range(2) for s in range(2)]
    played = play_episodes(
        engine.generate,
        env,
        requests,
        tokenizer,
        seed=SEED,
        max_tokens=SAMPLING.max_tokens,
        temperature=SAMPLING.temperature,
        eos_token_ids=eos,
    )
    assert [p.uid for p in played] == [r.uid for r in requests]
    assert sum(len(p.turns) for p in played) > len(played)  # some episodes went past their first turn
    wrong_stream: list[bool] = []
    for request, episode in zip(requests, played, strict=True):
        assert episode.episode is not None
        turns = [policy_turn(tokenizer, r.completion_ids, eos) for r in episode.turns]
        rebuilt = replay(env, request.example, turns)
        assert rebuilt == episode.episode
        prompts = turn_prompt_ids(env, rebuilt, tokenizer)
        assert prompts == episode.prompt_ids
        completions = [r.completion_ids for r in episode.turns]
        samples = episode_samples(prompts, completions)
        trained = [t for s in samples for t, sampled in zip(s.token_ids, s.sampled, strict=True) if sampled]
        assert trained == [t for c in completions for t in c]
        proofs = build_proofs([r.hidden_states for r in episode.turns])
        for turn, (prompt, result, proof) in enumerate(zip(prompts, episode.turns, proofs, strict=True)):

            def verify(stream: int, prompt: list[int] = prompt, result: Any = result, proof: bytes = proof) -> Any:
                return verify_rollout(
                    sampling=SAMPLING,
                    seed=SEED,
                    stream=stream,
                    prompt_ids=prompt,
                    completion_ids=result.completion_ids,
                    logprobs=result.logprobs,
                    finish_reason=result.finish_reason,
                    proof=proof,
                    prefill=engine.prefill([prompt], [result.completion_ids])[0],
                    eos_token_ids=eos,
                )

            honest = verify(turn_stream(request.prompt_index, request.sample_index, turn))
            assert honest.accepted, honest.reasons
            if turn > 0 and len(result.completion_ids) > 2:  # one or two likely tokens fit any noise
                wrong_stream.append(verify(turn_stream(request.prompt_index, request.sample_index, 0)).accepted)
    # a later turn's draw checked on the first turn's noise is not that draw
    assert wrong_stream and not any(wrong_stream)
