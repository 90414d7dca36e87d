"""The validator's entry point: ``verify_rollout`` checks a submitted rollout against a prefill.

Given the task's sampling params, seed and the sample's noise stream, the rollout's tokens,
claimed log-probabilities, finish reason and proof bytes, and the validator's own prefill of
prompt + completion with the same policy (a ``PrefillResult``: hidden states and float32
logits aligned so that row i drew token i), it returns a :class:`RolloutVerdict` whose
``reasons`` say every check that failed:

- shape: lengths agree, 1 <= tokens <= max_tokens, token ids inside the vocabulary, logprobs finite;
- termination: "stop" ends with an EOS id, "length" has exactly max_tokens tokens, and no EOS
  id appears before the last token (the sampler stops there);
- TOPLOC: every proof chunk within the thresholds of :class:`toploc.config.ToplocConfig`;
- sampling replay: every token is the argmax of ``logits / T + g`` recomputed, within
  ``sampling_tolerance`` for near ties (catches tokens from another model or temperature even
  when the proof was built by an honest prefill);
- logprobs: each claimed value within ``logprob_tolerance`` of ``log_softmax(logits / T)``.

Malformed input (a proof of the wrong length or with values outside the field, out-of-vocab
ids) is a rejection with a reason, never an exception. ``precheck_rollout`` runs the checks
that need no model, so a validator can refuse junk before spending a prefill on it (and must:
an out-of-vocabulary id cannot be prefilled). ``verify_claims`` does the same for many
rollouts at once (the proof checks of all of them share each field operation, and their
sampling replays and log-softmaxes run as one batch). Only the
caller's own mistakes raise (ValueError): a prefill of another completion, or a task with
``top_k`` set, which verifiable sampling does not support.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch

from protocol.errors import ProofError
from protocol.schemas import SamplingParams
from toploc.config import ToplocConfig
from toploc.proof import ChunkCheck, check_proofs
from toploc.sampling import replay_gaps, stream_states

MAX_REASONS = 16


class Recomputed(Protocol):
    """What verification needs from a prefill (engines.base.PrefillResult has it)."""

    hidden_states: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class RolloutVerdict:
    """Accepted when no check failed; ``reasons`` name each failure for the worker and the ledger."""

    accepted: bool
    reasons: tuple[str, ...]
    chunks: tuple[ChunkCheck, ...] = field(default=(), repr=False)
    """Per-chunk proof measures (empty when the proof was not checked)."""
    max_sampling_gap: float = math.nan
    """Largest noisy-score gap of a claimed token (0 when every token is the exact noisy argmax)."""
    max_logprob_error: float = math.nan


@dataclass(frozen=True)
class SampleTask:
    """One sample as the ledger issued it: what the validator replays the claim against."""

    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    """The task's sampling seed (Task.sampling_seed)."""
    stream: int
    """toploc.sampling.sample_stream(prompt_index, sample_index)."""
    eos_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Claim:
    """What a worker submitted for one SampleTask."""

    task: SampleTask
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    proof: bytes


def decode_proof_b64(proof_b64: str) -> bytes:
    """The proof bytes of a Rollout's ``proof_b64``; ProofError when it is not valid base64."""
    try:
        return base64.b64decode(proof_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProofError(f"proof is not valid base64: {exc}") from exc


def _termination_reasons(
    completion_ids: Sequence[int], finish_reason: str, max_tokens: int, eos_token_ids: Sequence[int]
) -> list[str]:
    reasons = []
    eos = set(eos_token_ids)
    early_eos = [i for i, token in enumerate(completion_ids[:-1]) if token in eos]
    if early_eos:
        reasons.append(f"termination: EOS at position {early_eos[0]} but the completion goes on")
    if finish_reason == "stop" and completion_ids and completion_ids[-1] not in eos:
        reasons.append("termination: finish_reason 'stop' but the last token is not an EOS id (truncated completion)")
    elif finish_reason == "length" and len(completion_ids) != max_tokens:
        reasons.append(
            f"termination: finish_reason 'length' but {len(completion_ids)} tokens != max_tokens {max_tokens}"
        )
    elif finish_reason not in ("stop", "length"):
        reasons.append(f"termination: unknown finish_reason {finish_reason!r}")
    return reasons


def precheck_rollout(
    *,
    sampling: SamplingParams,
    completion_ids: Sequence[int],
    logprobs: Sequence[float],
    finish_reason: str,
    eos_token_ids: Sequence[int],
    vocab_size: int,
) -> list[str]:
    """Reasons to reject a rollout that need no model: lengths, vocabulary, termination, logprob values."""
    if sampling.top_k is not None:
        raise ValueError("verifiable sampling draws from the full vocabulary; tasks must not set top_k")
    reasons = []
    num_tokens = len(completion_ids)
    if num_tokens == 0:
        reasons.append("shape: empty completion (at least one token is always drawn)")
    if num_tokens > sampling.max_tokens:
        reasons.append(f"shape: {num_tokens} tokens > max_tokens {sampling.max_tokens}")
    if len(logprobs) != num_tokens:
        reasons.append(f"shape: {len(logprobs)} logprobs for {num_tokens} tokens")
    outside = [t for t in completion_ids if not 0 <= t < vocab_size]
    if outside:
        reasons.append(f"shape: {len(outside)} token ids outside the vocabulary [0, {vocab_size}), e.g. {outside[0]}")
    if any(not math.isfinite(lp) or lp > 0 for lp in logprobs):
        reasons.append("logprobs: a claimed logprob is not a finite number <= 0")
    reasons.extend(_termination_reasons(completion_ids, finish_reason, sampling.max_tokens, eos_token_ids))
    return reasons


def precheck_claim(claim: Claim, vocab_size: int) -> list[str]:
    """:func:`precheck_rollout` of a claim (what validators run on every rollout before any prefill)."""
    return precheck_rollout(
        sampling=claim.task.sampling,
        completion_ids=claim.completion_ids,
        logprobs=claim.logprobs,
        finish_reason=claim.finish_reason,
        eos_token_ids=claim.task.eos_token_ids,
        vocab_size=vocab_size,
    )


def _within_sum_allowance(check: ChunkCheck, config: ToplocConfig) -> bool:
    """Whether a chunk with some exponent-matching entries carries at most the allowed total mantissa error."""
    return math.isfinite(check.mant_err_mean) and check.mant_err_sum <= config.mant_err_sum_allowance


def _proof_reasons(checks: Sequence[ChunkCheck], config: ToplocConfig) -> list[str]:
    limits = (
        ("exponent mismatches", "exp_mismatches", config.max_exp_mismatches),
        ("sign mismatches", "sign_mismatches", config.max_sign_mismatches),
        ("mantissa error mean", "mant_err_mean", config.max_mant_err_mean),
        ("mantissa error median", "mant_err_median", config.max_mant_err_median),
    )
    reasons = []
    for label, attribute, limit in limits:
        failing = [
            (i, getattr(check, attribute))
            for i, check in enumerate(checks)
            if getattr(check, attribute) > limit
            and not (attribute == "mant_err_mean" and _within_sum_allowance(check, config))
        ]
        if failing:
            chunk, worst = max(failing, key=lambda item: item[1])
            reasons.append(
                f"toploc: {len(failing)}/{len(checks)} chunks over the {label} limit {limit}"
                f" (worst: chunk {chunk} at {worst:.4g})"
            )
    return reasons


def verify_rollout(
    *,
    sampling: SamplingParams,
    seed: int,
    stream: int,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float],
    finish_reason: Literal["stop", "length"],
    proof: bytes,
    prefill: Recomputed,
    eos_token_ids: Sequence[int],
    config: ToplocConfig | None = None,
) -> RolloutVerdict:
    """Every check of one rollout against the validator's prefill of prompt + completion."""
    task = SampleTask(list(prompt_ids), sampling, seed, stream, tuple(eos_token_ids))
    claim = Claim(task, list(completion_ids), list(logprobs), finish_reason, proof)
    return verify_claims([claim], [prefill], config)[0]


def verify_claims(
    claims: Sequence[Claim], prefills: Sequence[Recomputed], config: ToplocConfig | None = None
) -> list[RolloutVerdict]:
    """:func:`verify_rollout` for many rollouts; ``prefills[i]`` recomputes prompt + completion of ``claims[i]``."""
    config = config or ToplocConfig()
    if len(claims) != len(prefills):
        raise ValueError(f"{len(claims)} claims but {len(prefills)} prefills")
    reasons: list[list[str]] = []
    for claim, prefill in zip(claims, prefills, strict=True):
        found = precheck_claim(claim, prefill.logits.shape[-1])
        if not claim.task.prompt_ids:
            found.append("shape: empty prompt")
        num_tokens = len(claim.completion_ids)
        if not found and (prefill.hidden_states.shape[0] != num_tokens or prefill.logits.shape[0] != num_tokens):
            raise ValueError(
                f"a prefill has {prefill.hidden_states.shape[0]} state rows and {prefill.logits.shape[0]} logit rows"
                f" for {num_tokens} completion tokens: prefill prompt + that completion"
            )
        reasons.append(found)
    checked = [i for i, found in enumerate(reasons) if not found]
    outcomes = check_proofs(
        [prefills[i].hidden_states for i in checked], [claims[i].proof for i in checked], config.topk, config.chunk_size
    )
    replays = _replay_all([claims[i] for i in checked], [prefills[i] for i in checked])
    verdicts: dict[int, RolloutVerdict] = {}
    for i, outcome, (gaps, errors) in zip(checked, outcomes, replays, strict=True):
        chunks: list[ChunkCheck] = []
        if isinstance(outcome, ProofError):
            reasons[i].append(f"toploc: malformed proof: {outcome.message}")
        else:
            chunks = outcome
            reasons[i].extend(_proof_reasons(chunks, config))
        reasons[i].extend(_replay_reasons(gaps, errors, config))
        verdicts[i] = RolloutVerdict(
            accepted=not reasons[i],
            reasons=tuple(reasons[i][:MAX_REASONS]),
            chunks=tuple(chunks),
            max_sampling_gap=float(gaps.max()),
            max_logprob_error=float(errors.max()),
        )
    return [verdicts.get(i) or RolloutVerdict(False, tuple(found[:MAX_REASONS])) for i, found in enumerate(reasons)]


def _replay_all(claims: Sequence[Claim], prefills: Sequence[Recomputed]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(sampling gaps, logprob errors) of each claim, per token: one batched replay of all their rows.

    Rows of every claim are stacked (those of one vocabulary size together), each with its own
    temperature, noise stream and position, so the replay and the log-softmax run as a few large
    tensor operations instead of a dozen small ones per rollout; every value is the one a replay of
    the claim alone gives (tests/unit/toploc/test_verify.py checks it).
    """
    results: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0), np.empty(0))] * len(claims)
    by_vocab: dict[int, list[int]] = {}
    for index, prefill in enumerate(prefills):
        by_vocab.setdefault(prefill.logits.shape[-1], []).append(index)
    for group in by_vocab.values():
        logits = torch.cat([prefills[i].logits.to(torch.float32) for i in group])
        lengths = torch.tensor([len(claims[i].completion_ids) for i in group], dtype=torch.int64)
        temperatures = torch.tensor([claims[i].task.sampling.temperature for i in group], dtype=torch.float32)
        scaled = logits / temperatures.repeat_interleave(lengths).reshape(-1, 1).to(logits.device)
        streams = torch.tensor([claims[i].task.stream for i in group], dtype=torch.int64)
        states = stream_states([claims[i].task.seed for i in group], streams, logits.device)
        positions = torch.cat([torch.arange(int(n), dtype=torch.int64) for n in lengths])
        tokens = torch.tensor([t for i in group for t in claims[i].completion_ids], dtype=torch.int64)
        gaps = replay_gaps(scaled, states.repeat_interleave(lengths.to(logits.device)), positions, tokens)
        recomputed = torch.log_softmax(scaled, dim=-1).gather(1, tokens.reshape(-1, 1).to(logits.device)).reshape(-1)
        claimed = torch.tensor([lp for i in group for lp in claims[i].logprobs], dtype=torch.float64)
        errors = (recomputed.to(torch.float64).cpu() - claimed).abs()
        offsets = lengths.cumsum(0).tolist()
        for i, gap_rows, error_rows in zip(
            group, np.split(gaps.cpu().numpy(), offsets[:-1]), np.split(errors.numpy(), offsets[:-1]), strict=True
        ):
            results[i] = (gap_rows, error_rows)
    return results


def _replay_reasons(gaps: np.ndarray, errors: np.ndarray, config: ToplocConfig) -> list[str]:
    """The sampling replay's and the logprob check's reasons for one rollout's per-token gaps and errors."""
    reasons = []
    for values, limit, what in (
        (
            gaps,
            config.sampling_tolerance,
            "sampling: {count}/{total} tokens are not the seeded draw (first at"
            " position {first}, gap {value:.4g} > {limit})",
        ),
        (
            errors,
            config.logprob_tolerance,
            "logprobs: {count}/{total} claimed logprobs differ from the recomputed"
            " ones (first at position {first} by {value:.4g} > {limit})",
        ),
    ):
        over = np.flatnonzero(values > limit)
        if over.size:
            first = int(over[0])
            reasons.append(
                what.format(count=over.size, total=values.size, first=first, value=float(values[first]), limit=limit)
            )
    return reasons
