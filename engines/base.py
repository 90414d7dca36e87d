"""The inference engine interface every backend (vLLM, HF transformers) implements.

An engine generates completions with the verifiable sampler (toploc.sampling), returning for
each completion token the final hidden state (after the last norm) that produced its logits
and its log-probability under the unperturbed policy at the task's temperature; it can also
prefill prompt + completion to recompute the same quantities (what validators do), and reload
policy weights in place from a downloaded checkpoint directory. Prefill is a separate
protocol (PrefillEngine) because not every backend offers it.

LoRA: an engine started on a base model also serves adapters on top of it (PEFT's directory layout,
``adapter_config.json`` + ``adapter_model.safetensors``), each under a name (:meth:`Engine.load_adapter`);
a request names the adapter it is generated with (``GenerationRequest.adapter``, None: the base alone),
so one copy of the base serves several adapters, e.g. several runs' policies.

Row alignment, used by proofs and checks alike: for a completion of n tokens, row i of
``hidden_states`` and entry i of ``logprobs`` belong to the forward position that *drew*
completion token i (the last prompt token for i = 0, completion token i - 1 after that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import torch

from environments.images import Image


@dataclass(frozen=True)
class GenerationRequest:
    uid: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int
    """The task's sampling seed, from the ledger."""
    stream: int
    """The sample's noise stream: toploc.sampling.sample_stream(prompt_index, sample_index)."""
    eos_token_ids: tuple[int, ...] = ()
    adapter: str | None = None
    """The loaded LoRA adapter to generate with (:meth:`Engine.load_adapter`); None: the base weights alone."""
    images: tuple[Image, ...] = ()
    """The prompt's images, in the order of its image blocks (a vision-language policy only)."""


@dataclass
class GenerationResult:
    uid: str
    completion_ids: list[int]
    logprobs: list[float]
    """log_softmax(logits / T)[token] of each drawn token, without the sampling noise."""
    finish_reason: Literal["stop", "length"]
    hidden_states: torch.Tensor = field(repr=False)
    """(len(completion_ids), hidden_size): the final-norm states that drew each token."""


@dataclass
class PrefillResult:
    hidden_states: torch.Tensor = field(repr=False)
    """(len(completion_ids), hidden_size), aligned as in GenerationResult."""
    logits: torch.Tensor = field(repr=False)
    """(len(completion_ids), vocab_size) float32 logits that drew each completion token."""


class Engine(Protocol):
    """What the worker loop needs from an inference backend."""

    @property
    def name(self) -> Literal["vllm", "hf"]: ...

    @property
    def vocab_size(self) -> int: ...

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def load_weights(self, checkpoint_dir: Path) -> None:
        """Replace the weights in place with those of an HF safetensors checkpoint directory."""
        ...

    def load_adapter(self, name: str, adapter_dir: Path) -> None:
        """Load the LoRA adapter of a PEFT adapter directory under ``name``, replacing in place the one loaded under
        that name before; requests naming it are generated with it from the next call on."""
        ...

    def remove_adapter(self, name: str) -> None:
        """Forget adapter ``name`` (nothing happens when none is loaded under it)."""
        ...

    def close(self) -> None: ...


class PrefillEngine(Engine, Protocol):
    """An engine that can also recompute hidden states and logits by prefill (what validators use).

    The HF engine is one; the vLLM engine is not (vLLM has no cheap path that returns the
    hidden state of every position), so validators prefill with HF.
    """

    def prefill(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None = None,
        images: list[tuple[Image, ...]] | None = None,
    ) -> list[PrefillResult]:
        """Recompute each completion's rows; ``images[i]`` are prompt ``i``'s images (None: no prompt has any)."""
        ...
