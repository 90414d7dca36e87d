"""The HF transformers backend of the engine interface: batched generation with a KV cache.

Requests are sorted by prompt length and cut into batches of at most ``max_batch_size``;
each batch is left-padded, with an attention mask and position ids that start at 0 on each
row's first real token, so a row's numbers do not depend on its padding. Every token is drawn
by the verifiable sampler (``argmax(logits / T + g)``, toploc.sampling) on the row's own noise
stream at position = completion tokens drawn so far; the engine keeps the final-norm hidden
state that drew it (the decoder's ``last_hidden_state``, which for Qwen2 and other HF causal
LMs is the output of the last norm, i.e. ``output_hidden_states[-1]``) and its log-probability
under ``log_softmax(logits / T)``. A row stops at one of its EOS ids (kept in the completion,
finish reason "stop") or at ``max_tokens`` ("length"); finished rows leave the batch and the
KV cache. ``prefill`` recomputes the same rows for prompt + completion in one forward pass,
as a validator does. Hidden states come back as float32 whatever the model dtype (exact for
bf16). Runs in float32 by default; workers and validators pass the run's precision (bfloat16
by default on GPUs). Weights reload in place from an HF safetensors directory (any layout
``transformers`` loads: tied heads, Qwen3-MoE's per-expert files).

LoRA adapters (engines/adapters.py) are injected with PEFT under their names, their tensors copied in
place when a new version of the same shape replaces one; requests are grouped by adapter and each
group runs with only its adapter on (none: the base alone). One lock serializes the model's use, so
several task loops (several runs on one base) may share the engine.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from engines.adapters import LoraAdapter, read_adapter
from engines.base import GenerationRequest, GenerationResult, PrefillResult
from engines.hf_vision import VisionBatch, vision_batch
from engines.vision import VisionInputs, auto_model_class, never_draw_vision_tokens
from environments.images import Image
from runtime.logs import adopt_transformers_logging
from runtime.memory import release_free_memory
from toploc.sampling import draw_tokens_at, stream_states

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """Generation and prefill with an HF causal LM loaded from a local checkpoint directory."""

    name: Literal["hf"] = "hf"

    def __init__(
        self,
        checkpoint_dir: Path,
        *,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        device: str = "cpu",
        max_batch_size: int = 64,
        num_threads: int | None = None,
        attn_implementation: str = "sdpa",
    ) -> None:
        adopt_transformers_logging()
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if num_threads is not None:
            # Process-wide: torch has one intra-op pool. Set here so a worker's engine owns it.
            torch.set_num_threads(num_threads)
        self.dtype = DTYPES[dtype]
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.vision = VisionInputs.of_checkpoint(Path(checkpoint_dir))
        """The policy's image inputs; None for a text-only policy."""
        self._loader: Any = auto_model_class(self.vision)
        self.model: Any = self._loader.from_pretrained(
            checkpoint_dir, dtype=self.dtype, attn_implementation=attn_implementation
        ).to(self.device)
        self.model.eval()
        if self.vision is not None:
            never_draw_vision_tokens(self.model, self.vision)
        self._decoder: Any = self.model.base_model
        self._head: Any = self.model.get_output_embeddings()
        self.pad_token_id = 0
        self._adapters: dict[str, tuple[str, tuple[int, float, tuple[str, ...], tuple[str, ...]]]] = {}
        """Loaded adapter name -> (its PEFT name in the model, its shape key: what a replacement must match to be
        copied in place). PEFT names become module names, so they are ours (``adapter<N>``), not the callers'."""
        self._next_slot = 0
        self._lock = threading.RLock()

    @property
    def vocab_size(self) -> int:
        return int(self._head.weight.shape[0])

    @property
    def max_positions(self) -> int:
        config = self.model.config.get_text_config()
        return int(getattr(config, "max_position_embeddings", 1 << 30))

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        vocab_size = self.vocab_size
        for token_id in ids:
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"{what}: token id {token_id} is outside the vocabulary [0, {vocab_size})")

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
        images: VisionBatch | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states (batch, len, hidden) for the new tokens; ``cache`` is extended in place. With
        ``images``: the batch's pixels and their positions (a forward pass from the prompt)."""
        output = self._decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids if images is None else images.position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            **({} if images is None else images.model_inputs),
        )
        hidden: torch.Tensor = output.last_hidden_state
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self._head(hidden)
        return logits.to(torch.float32)

    def _left_pad(self, sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, position_ids), each (batch, longest), padded on the left."""
        longest = max(len(seq) for seq in sequences)
        input_ids = torch.full((len(sequences), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
        for row, seq in enumerate(sequences):
            if seq:
                input_ids[row, longest - len(seq) :] = torch.tensor(seq, dtype=torch.long)
                attention_mask[row, longest - len(seq) :] = 1
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        return input_ids.to(self.device), attention_mask.to(self.device), position_ids.to(self.device)

    def _vision_batch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows_images: Sequence[tuple[Image, ...]]
    ) -> VisionBatch | None:
        """The batch's image inputs (None: no row has images); ValueError for images and a text-only policy."""
        if self.vision is None:
            if any(rows_images):
                raise ValueError("the policy reads text only; a prompt with images needs a vision-language policy")
            return None
        return vision_batch(self.vision, self._decoder, input_ids, attention_mask, rows_images)

    def _batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices grouped into batches of similar length (less padding), each <= max_batch_size."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        return [order[i : i + self.max_batch_size] for i in range(0, len(order), self.max_batch_size)]

    @torch.inference_mode()
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        for request in requests:
            if not request.prompt_ids:
                raise ValueError(f"request {request.uid}: empty prompt")
            if request.max_tokens < 1:
                raise ValueError(f"request {request.uid}: max_tokens must be >= 1")
            if request.temperature <= 0:
                raise ValueError(f"request {request.uid}: verifiable sampling needs temperature > 0")
            if len(request.prompt_ids) + request.max_tokens > self.max_positions:
                raise ValueError(
                    f"request {request.uid}: prompt ({len(request.prompt_ids)}) + max_tokens ({request.max_tokens})"
                    f" exceeds the model's {self.max_positions} positions"
                )
            self._check_ids(request.prompt_ids, f"request {request.uid} prompt")
            self._check_adapter(request.adapter)
        results: list[GenerationResult | None] = [None] * len(requests)
        by_adapter: dict[str | None, list[int]] = {}
        for index, request in enumerate(requests):
            by_adapter.setdefault(request.adapter, []).append(index)
        with self._lock:
            for adapter, indices in by_adapter.items():
                self._use_adapter(adapter)
                for batch in self._batches([len(requests[i].prompt_ids) for i in indices]):
                    chosen = [indices[i] for i in batch]
                    for index, result in zip(chosen, self._generate_batch([requests[i] for i in chosen]), strict=True):
                        results[index] = result
        return [result for result in results if result is not None]

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from transformers import DynamicCache

        num_rows = len(requests)
        input_ids, attention_mask, position_ids = self._left_pad([r.prompt_ids for r in requests])
        images = self._vision_batch(input_ids, attention_mask, [r.images for r in requests])
        cache = DynamicCache(config=self.model.config)
        hidden = self._forward(input_ids, attention_mask, position_ids, cache, images)[:, -1]
        next_positions = position_ids[:, -1] + 1 + (0 if images is None else images.offsets)

        temperatures = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        # The (seed, stream) part of every row's noise hash, once per batch instead of once per token.
        states = stream_states([r.seed for r in requests], torch.tensor([r.stream for r in requests]), self.device)
        max_tokens = [r.max_tokens for r in requests]
        eos_sets = [frozenset(r.eos_token_ids) for r in requests]
        tokens: list[list[int]] = [[] for _ in range(num_rows)]
        logprobs: list[list[float]] = [[] for _ in range(num_rows)]
        rows_drawn: list[list[torch.Tensor]] = [[] for _ in range(num_rows)]
        finish: list[Literal["stop", "length"]] = ["length"] * num_rows
        live = list(range(num_rows))  # request index of each row still in the batch

        while live:
            logits = self._logits(hidden)
            live_tensor = torch.tensor(live, dtype=torch.long)
            positions = torch.tensor([len(tokens[i]) for i in live], dtype=torch.int64)
            drawn = draw_tokens_at(logits, temperatures[live_tensor], states[live_tensor.to(self.device)], positions)
            drawn = drawn.to(logits.device)
            drawn_logprobs = torch.log_softmax(logits / temperatures[live_tensor].reshape(-1, 1).to(logits.device), -1)
            drawn_logprobs = drawn_logprobs.gather(1, drawn.reshape(-1, 1)).reshape(-1)
            hidden_f32 = hidden.to(torch.float32).cpu()
            keep: list[int] = []
            for row, (index, token, logprob) in enumerate(
                zip(live, drawn.tolist(), drawn_logprobs.tolist(), strict=True)
            ):
                tokens[index].append(token)
                logprobs[index].append(logprob)
                rows_drawn[index].append(hidden_f32[row])
                if token in eos_sets[index]:
                    finish[index] = "stop"
                elif len(tokens[index]) < max_tokens[index]:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(live):
                keep_tensor = torch.tensor(keep, dtype=torch.long, device=self.device)
                cache.batch_select_indices(keep_tensor)
                attention_mask = attention_mask[keep_tensor]
                next_positions = next_positions[keep_tensor]
                drawn = drawn[keep_tensor]
                live = [live[row] for row in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], dim=1)
            hidden = self._forward(
                drawn.reshape(-1, 1).to(self.device), attention_mask, next_positions.reshape(-1, 1), cache
            )[:, -1]
            next_positions = next_positions + 1

        return [
            GenerationResult(
                uid=request.uid,
                completion_ids=tokens[i],
                logprobs=logprobs[i],
                finish_reason=finish[i],
                hidden_states=torch.stack(rows_drawn[i]),
            )
            for i, request in enumerate(requests)
        ]

    @torch.inference_mode()
    def prefill(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None = None,
        images: list[tuple[Image, ...]] | None = None,
    ) -> list[PrefillResult]:
        self._check_adapter(adapter)
        with self._lock:
            self._use_adapter(adapter)
            return self._prefill(prompts, completions, images or [()] * len(prompts))

    def _prefill(
        self, prompts: list[list[int]], completions: list[list[int]], images: list[tuple[Image, ...]]
    ) -> list[PrefillResult]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if len(images) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(images)} lists of images")
        for index, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            if not prompt:
                raise ValueError(f"prefill {index}: empty prompt")
            self._check_ids(prompt, f"prefill {index} prompt")
            self._check_ids(completion, f"prefill {index} completion")
            if len(prompt) + len(completion) > self.max_positions:
                raise ValueError(f"prefill {index}: longer than the model's {self.max_positions} positions")
        results: list[PrefillResult | None] = [None] * len(prompts)
        # The last completion token never drew anything: the forward pass stops before it.
        sequences = [p + c[:-1] for p, c in zip(prompts, completions, strict=True)]
        for batch in self._batches([len(s) for s in sequences]):
            input_ids, attention_mask, position_ids = self._left_pad([sequences[i] for i in batch])
            batch_images = self._vision_batch(input_ids, attention_mask, [images[i] for i in batch])
            hidden = self._forward(input_ids, attention_mask, position_ids, None, batch_images)
            width = input_ids.shape[1]
            for row, index in enumerate(batch):
                num_completion = len(completions[index])
                end = width  # the sequence is right-aligned
                start = end - num_completion
                rows = hidden[row, start:end]
                results[index] = PrefillResult(
                    hidden_states=rows.to(torch.float32).cpu(), logits=self._logits(rows).cpu()
                )
        return [result for result in results if result is not None]

    def load_weights(self, checkpoint_dir: Path) -> None:
        """Copy the weights of an HF safetensors checkpoint into the loaded model, in place."""
        with self._lock:
            if self._adapters:
                raise ValueError(
                    f"the engine serves LoRA adapters on its base; it does not reload the base ({checkpoint_dir})"
                )
            self._load_weights(checkpoint_dir)

    def _load_weights(self, checkpoint_dir: Path) -> None:
        from safetensors.torch import load_file

        files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {checkpoint_dir}")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        expected = set(self.model.state_dict())
        if set(state) - expected and getattr(self.model, "_weight_conversions", None):
            state = self._converted_state(checkpoint_dir)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = expected - set(state) - tied
        unexpected = set(state) - expected
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {checkpoint_dir} does not match the loaded model: "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        with torch.no_grad():
            parameters = self.model.state_dict()
            for key, tensor in state.items():
                if parameters[key].shape != tensor.shape:
                    raise ValueError(f"{key}: checkpoint shape {tuple(tensor.shape)} != {tuple(parameters[key].shape)}")
            for key, tensor in state.items():
                parameters[key].copy_(tensor.to(parameters[key].dtype))
        del state
        release_free_memory()  # the loaded copy is garbage now: a node switching policies every step stays flat

    def _converted_state(self, checkpoint_dir: Path) -> dict[str, torch.Tensor]:
        """The checkpoint's weights in the module layout, for architectures whose files differ from it
        (Qwen3-MoE: one tensor per expert on disk, one fused tensor per block in ``transformers``; Qwen2-VL: its
        text model under another prefix).

        ``transformers`` alone knows each conversion, so this loads the checkpoint as a second model
        on the CPU (for the moment of the reload) and refuses a checkpoint that does not fill it exactly.
        """
        loaded, info = self._loader.from_pretrained(checkpoint_dir, dtype=self.dtype, output_loading_info=True)
        kinds = ("missing_keys", "unexpected_keys", "mismatched_keys")
        wrong = {kind: sorted(info.get(kind) or [])[:5] for kind in kinds}
        if any(wrong.values()):
            raise ValueError(f"checkpoint {checkpoint_dir} does not match the loaded model: {wrong}")
        state: dict[str, torch.Tensor] = loaded.state_dict()
        return state

    def _check_adapter(self, name: str | None) -> None:
        if name is not None and name not in self._adapters:
            raise ValueError(f"no LoRA adapter {name!r} is loaded (loaded: {sorted(self._adapters) or 'none'})")

    def _use_adapter(self, name: str | None) -> None:
        """Only ``name``'s adapter on (None: all off, the base alone); under the lock."""
        if not self._adapters:
            return
        if name is None:
            self.model.disable_adapters()
        else:
            self.model.enable_adapters()
            self.model.set_adapter(self._adapters[name][0])

    @torch.inference_mode()
    def load_adapter(self, name: str, adapter_dir: Path) -> None:
        """Load the PEFT adapter in ``adapter_dir`` as ``name``: copied in place over the one loaded under that name
        when both have the same shape, else injected anew (an AdapterError, one line, for one that is not plain
        LoRA; a ValueError for one whose modules or shapes are not this base's)."""
        adapter = read_adapter(adapter_dir)
        with self._lock:
            if name not in self._adapters or self._adapters[name][1] != adapter.shape_key:
                self._remove_adapter(name)
                slot = f"adapter{self._next_slot}"
                self._next_slot += 1
                with warnings.catch_warnings():  # PEFT warns that a second adapter joins the first: that is the point
                    warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                    self.model.add_adapter(adapter.peft_config(), adapter_name=slot)
                self._adapters[name] = (slot, adapter.shape_key)
                self.model.eval()
            try:
                self._copy_adapter(name, adapter)
            except ValueError:
                self._remove_adapter(name)
                raise
        release_free_memory()

    def _copy_adapter(self, name: str, adapter: LoraAdapter) -> None:
        """Copy every (A, B) of ``adapter`` into the layers injected for ``name``; the set of modules must be the
        injected one exactly, each matrix its layer's shape."""
        slot = self._adapters[name][0]
        injected = {
            module_name
            for module_name, module in self.model.named_modules()
            if hasattr(module, "lora_A") and slot in module.lora_A
        }
        if injected != set(adapter.weights):
            missing, extra = sorted(injected - set(adapter.weights)), sorted(set(adapter.weights) - injected)
            raise ValueError(f"adapter {name!r} does not fit the base: missing {missing[:3]}, unexpected {extra[:3]}")
        for module_name, (a, b) in adapter.weights.items():
            layer = self.model.get_submodule(module_name)
            for target, value in ((layer.lora_A[slot].weight, a), (layer.lora_B[slot].weight, b)):
                if target.shape != value.shape:
                    raise ValueError(
                        f"adapter {name!r}: {module_name} has {tuple(value.shape)}, the base {tuple(target.shape)}"
                    )
                target.copy_(value.to(target.dtype))

    def remove_adapter(self, name: str) -> None:
        with self._lock:
            self._remove_adapter(name)

    def _remove_adapter(self, name: str) -> None:
        if name in self._adapters:
            self.model.delete_adapter(self._adapters.pop(name)[0])

    def close(self) -> None:
        self.model = None
        self._decoder = None
        self._head = None
