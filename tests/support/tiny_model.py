"""Tiny random-init checkpoints of each supported architecture, for engine tests, TOPLOC calibration and benches.

Nothing is downloaded: the model is built from the architecture's ``transformers`` config class
with a fixed seed and saved as HF safetensors in a local directory, the layout the engines load.
:data:`ARCHITECTURES` is the architecture matrix (docs/models.md): ``qwen2`` (untied, the default,
whose bytes every TOPLOC calibration was measured on), ``qwen2_tied`` (tied input and output
embeddings, as most small real checkpoints have), ``qwen3`` (tied, q/k norms, as Qwen3-0.6B),
``llama3`` (Llama 3.1's rope: theta 500000 with the ``llama3`` frequency scaling) and ``qwen3_moe``
(sparse MoE blocks in every layer, top-k routing over a few experts, as Qwen3-30B-A3B).

Two knobs make a random model behave more like a trained one where the checks need it:
``logit_scale`` multiplies the logits (a trained model's next-token distribution is peaked, while
a random init at the default scale is nearly uniform and lets the sampling noise decide every
token), and ``eos_bias`` raises the EOS token's logit so completions end at varied lengths. An
untied model gets both through its output head; a tied one cannot (its head is the input
embedding, whose scale the layers see), so it scales the final norm's weight instead, which scales
the logits alike. This is not the built-in demo model (trainer/ owns that), though both are made
by :func:`engines.random_model.random_causal_lm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from engines.random_model import random_causal_lm

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TINY_EOS_TOKEN_ID = 1

Architecture = Literal["qwen2", "qwen2_tied", "qwen3", "llama3", "qwen3_moe"]
ARCHITECTURES: tuple[Architecture, ...] = get_args(Architecture)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128,
}
"""Llama 3.1's rope parameters (its config.json: theta 500000, llama3 scaling), its original context of 8192
scaled down to 128 so that more of a tiny model's 16 frequencies are rescaled (and transformers does not warn)."""


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    logit_scale: float = 8.0
    """Multiplies the logits after init: they then have a standard deviation of ~1.3 nats, not ~0.16."""
    eos_bias: float = 1.5
    """Raises the EOS logit by about 1.7x this on average (a few % per step at 1.5); 0 disables."""
    architecture: Architecture = "qwen2"
    num_experts: int = 4
    """qwen3_moe only: experts per MoE block."""
    num_experts_per_tok: int = 2
    """qwen3_moe only: experts each token is routed to."""
    moe_intermediate_size: int = 64
    """qwen3_moe only: each expert's MLP width."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def tiny_config(spec: TinyModelSpec) -> PretrainedConfig:
    """The ``transformers`` config of ``spec``'s architecture and shape (fp32, offline)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    common: dict[str, Any] = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "bos_token_id": 0,
        "eos_token_id": TINY_EOS_TOKEN_ID,
        "pad_token_id": 0,
    }
    if spec.architecture in ("qwen2", "qwen2_tied"):
        # The default's keyword set is what every recorded calibration ran on: keep it as it is.
        return Qwen2Config(**common, tie_word_embeddings=spec.architecture == "qwen2_tied")
    if spec.architecture == "qwen3":
        return Qwen3Config(**common, head_dim=spec.head_dim, tie_word_embeddings=True, dtype="float32")
    if spec.architecture == "llama3":
        rope = dict(LLAMA3_ROPE)
        return LlamaConfig(
            **common, head_dim=spec.head_dim, rope_parameters=rope, tie_word_embeddings=False, dtype="float32"
        )
    if spec.architecture == "qwen3_moe":
        return Qwen3MoeConfig(
            **common,
            head_dim=spec.head_dim,
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.num_experts_per_tok,
            moe_intermediate_size=spec.moe_intermediate_size,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            tie_word_embeddings=False,
            dtype="float32",
        )
    raise ValueError(f"unknown architecture {spec.architecture!r}; known: {', '.join(ARCHITECTURES)}")


EOS_FEATURE_QWEN2 = 1.7
"""The mean final-norm feature in dimension 0 of the default Qwen2, which its EOS row's bias multiplies."""


def _eos_feature(model: Any, spec: TinyModelSpec) -> float:
    """The mean final-norm output in dimension 0 over a fixed batch of random tokens (what EOS's row reads)."""
    tokens = torch.randint(2, spec.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    tokens = tokens[:, : spec.max_position_embeddings]
    feature = float(model.base_model(input_ids=tokens).last_hidden_state[..., 0].mean())
    if feature < 0.1:
        raise ValueError(f"{spec.architecture}: the EOS feature is {feature:.3f}, too small to bias EOS by")
    return feature


def save_tiny_model(path: Path, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Build a random causal LM of ``spec`` (default: untied Qwen2) with ``seed`` and save it under ``path``."""
    spec = spec or TinyModelSpec()
    config = tiny_config(spec)
    model = random_causal_lm(config, seed)
    tied = bool(config.tie_word_embeddings)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        if tied:
            model.base_model.norm.weight.mul_(spec.logit_scale)
        else:
            head.mul_(spec.logit_scale)
        if spec.eos_bias:
            # No output bias in these architectures. Give every embedding a common offset in dimension 0,
            # which survives the layers as a mostly positive final-norm feature (mean ~1.7 in Qwen2 at this
            # init), and let the EOS row read it: EOS then ends completions at varied lengths. Other
            # architectures carry the feature at other sizes (and a tied head's row meets it multiplied
            # by the norm's logit_scale), so their EOS row gets what raises the logit by the same amount.
            model.get_input_embeddings().weight[:, 0] += 0.1
            if spec.architecture == "qwen2":
                head[TINY_EOS_TOKEN_ID, 0] += spec.eos_bias
            else:
                head[TINY_EOS_TOKEN_ID, 0] += EOS_FEATURE_QWEN2 * spec.eos_bias / _eos_feature(model, spec)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


save_tiny_qwen2 = save_tiny_model
"""The old name: every spec defaults to the untied Qwen2 it always built."""


def perturb_checkpoint(source: Path, target: Path, relative_noise: float, seed: int = 0) -> Path:
    """Copy a checkpoint with every weight multiplied by (1 + relative_noise * N(0, 1)) elementwise."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.mul_(1.0 + relative_noise * noise)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    return target


def quantize_checkpoint(source: Path, target: Path, bits: int = 8) -> Path:
    """Copy a checkpoint with every matrix fake-quantized to ``bits``-bit integers per output row (weight-only).

    What a worker serving a cheaper int8 build of the policy computes with: each row scaled so its
    largest magnitude is the largest integer, rounded, and scaled back (vectors such as norms stay)."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    levels = (1 << (bits - 1)) - 1
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                scale = parameter.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / levels
                parameter.copy_((parameter / scale).round() * scale)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    return target


def quantize_linear_layers(source: Path, target: Path, bits: int, group_size: int | None = None) -> Path:
    """Copy a checkpoint with every linear layer's weight fake-quantized to ``bits``-bit integers (weight-only).

    What a worker serving an int8 or int4 build of the policy computes with (the LLM.int8/GPTQ/AWQ family):
    each output row's weights, or each run of ``group_size`` of them along the input, share one scale that
    maps their largest magnitude to the largest integer; they are rounded and scaled back. Embeddings, norms
    and biases stay as they are."""
    from torch import nn
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    levels = (1 << (bits - 1)) - 1
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear):
                continue
            weight = module.weight
            rows, columns = weight.shape
            group = group_size or columns
            if columns % group:
                raise ValueError(f"a {rows}x{columns} weight does not split into groups of {group}")
            grouped = weight.reshape(rows, columns // group, group)
            scale = grouped.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / levels
            weight.copy_(((grouped / scale).round().clamp(-levels, levels) * scale).reshape(rows, columns))
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    return target
