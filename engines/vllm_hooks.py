"""The pieces of the vLLM engine that run inside vLLM's model runner.

- :class:`VerifiableSamplingProcessor`, a V1 logits processor that draws the token of each
  row of a request that carries ``seed`` and ``stream`` in ``SamplingParams.extra_args`` with
  toploc.sampling's verifiable sampler (``draw_tokens_at``: the argmax of logits plus the
  counter-based Gumbel noise, taking logs only for the tokens that can win) and leaves that
  token the row's only finite logit. Requests use ``temperature=0`` so vLLM's greedy argmax
  picks it. The model's logits are already divided by the task's temperature
  (``logits_processor.scale`` is set to 1/T), so the draw is at temperature 1, and vLLM's raw
  logprobs, computed before logits processors run, are log_softmax(logits / T) of the
  unperturbed policy.
- functions sent through ``LLM.collective_rpc`` (they receive the worker as ``self``):
  install a wrapper around ``model.compute_logits`` that records, per request ``uid``, the
  final-norm hidden state rows that drew a token (rows of partially prefilled requests,
  whose token vLLM discards, are skipped); take the recorded rows; set the logits scale;
  reload weights in place (and redo a tied output head, which that reload skips).

This module imports vllm; only engines.vllm imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from toploc.sampling import draw_tokens_at, stream_states


class VerifiableSamplingProcessor(LogitsProcessor):  # type: ignore[misc]  # vllm is untyped here
    """Draws argmax(logits + Gumbel(seed, stream, position, token)) for the rows of verifiable requests."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (seed, stream, live list of the request's output token ids)
        self.rows: dict[int, tuple[int, int, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            extra = params.extra_args or {}
            if "seed" in extra and "stream" in extra:
                self.rows[index] = (int(extra["seed"]), int(extra["stream"]), output_ids)
            else:
                self.rows.pop(index, None)
        for first, second, direction in batch_update.moved:
            row_first, row_second = self.rows.pop(first, None), self.rows.pop(second, None)
            if row_first is not None:
                self.rows[second] = row_first
            if direction == MoveDirectionality.SWAP and row_second is not None:
                self.rows[first] = row_second

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        by_seed: dict[int, list[tuple[int, int, int]]] = {}
        for index, (seed, stream, output_ids) in self.rows.items():
            if index < logits.shape[0]:
                by_seed.setdefault(seed, []).append((index, stream, len(output_ids)))
        for seed, entries in by_seed.items():
            indices = torch.tensor([entry[0] for entry in entries], device=logits.device)
            streams = torch.tensor([entry[1] for entry in entries])
            positions = torch.tensor([entry[2] for entry in entries])
            rows = logits[indices]
            # The logits are already tempered (scale 1/T): the draw is argmax(logits + g) at temperature 1.
            ones = torch.ones(rows.shape[0], dtype=torch.float32)
            drawn = draw_tokens_at(rows, ones, stream_states([seed] * len(entries), streams, logits.device), positions)
            # vLLM's greedy argmax then picks exactly the drawn token of each row.
            logits[indices] = -torch.inf
            logits[indices, drawn.to(logits.device)] = 0.0
        return logits


def install_capture(self: Any) -> bool:
    """Wrap compute_logits to record hidden-state rows by request uid (idempotent)."""
    runner = self.model_runner
    model = runner.model
    if getattr(model, "_prime_capture", None) is not None:
        return False
    original = model.compute_logits
    store: dict[str, list[torch.Tensor]] = {}

    def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        req_ids = runner.input_batch.req_ids
        discard = runner.discard_request_mask.np
        for row in range(min(hidden_states.shape[0], len(req_ids))):
            state = runner.requests.get(req_ids[row])
            params = getattr(state, "sampling_params", None)
            uid = (params.extra_args or {}).get("uid") if params is not None else None
            if uid is not None and not bool(discard[row]):
                store.setdefault(uid, []).append(hidden_states[row].detach().to(torch.float32).cpu().clone())
        return original(hidden_states, *args, **kwargs)

    model.compute_logits = compute_logits
    model._prime_capture = store
    return True


def take_captured(self: Any, uids: list[str]) -> dict[str, torch.Tensor]:
    """Remove and return the recorded rows of ``uids`` (an empty tensor for a uid never seen)."""
    store: dict[str, list[torch.Tensor]] = self.model_runner.model._prime_capture
    hidden_size = int(self.model_runner.model_config.get_hidden_size())
    taken: dict[str, torch.Tensor] = {}
    for uid in uids:
        rows = store.pop(uid, [])
        taken[uid] = torch.stack(rows) if rows else torch.empty(0, hidden_size)
    return taken


def set_logits_scale(self: Any, scale: float) -> float:
    processor = self.model_runner.model.logits_processor
    processor.scale = scale
    return float(processor.scale)


def reload_weights(self: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    self.model_runner.reload_weights(weights_iterator=iter(list(weights)))
    refresh_tied_head(self.model_runner.model)


def refresh_tied_head(model: Any) -> bool:
    """Redo the output head's post-load processing when it shares its weight with the input embedding.

    A tied checkpoint has no ``lm_head.weight``, so vLLM's in-place reload loads nothing into the
    head: the shared tensor does take the new embedding, but whatever the head derived from it at
    load time stays as it was (on CPU, the packed GEMM weight ``cpu_linear`` multiplies by), and
    the old head would keep drawing every token. Returns whether the head is tied (and was redone).
    """
    head: Any = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None or not any(
        parameter is weight
        for name, parameter in model.named_parameters(remove_duplicate=False)
        if not name.startswith("lm_head.")
    ):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True
