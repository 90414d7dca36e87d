"""LoRA adapter directories as engines read them: PEFT's layout, checked before anything is loaded.

An adapter directory holds ``adapter_config.json`` (rank ``r``, ``lora_alpha``, ``target_modules``) and
``adapter_model.safetensors``, whose tensors are named ``base_model.model.<module>.lora_A.weight`` (r x in)
and ``...lora_B.weight`` (out x r) for each adapted linear layer ``<module>`` of the base model. This is
what the trainer exports for a LoRA run (trainer/lora.py), what ``PeftModel.save_pretrained`` writes and
what vLLM loads. :func:`read_adapter` refuses anything else in one line: PEFT features that change the
arithmetic (DoRA, rsLoRA, per-module scales, extra trained modules) would make the engines and the
trainer compute different policies, so a run's adapters are plain LoRA.

A mixture-of-experts base (Qwen3-MoE) also has adapted parameters (``target_parameters``: the router
and each block's stacked experts, one rank-r adapter per expert in one A of E*r rows and one B of r*E
columns); PEFT gives the fused gate-and-up stack twice the rank and twice alpha (``rank_pattern``,
``alpha_pattern``). Those are accepted while every layer keeps the one scale ``alpha / r``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""What PEFT puts before the base model's own module names in an adapter's tensor names."""
MAX_RANK = 1024
MAX_NAMES = 64
"""At most this many target names or rank patterns in an adapter's config."""
_PARTS = ("lora_A", "lora_B")
_SAME_AS_NONE: dict[str, Any] = {
    "use_dora": False,
    "use_rslora": False,
    "modules_to_save": None,
    "bias": "none",
    "layers_to_transform": None,
}
"""PEFT settings an adapter may carry only at these values (or leave out): all others change the arithmetic."""


class AdapterError(ValueError):
    """An adapter directory that is not a plain LoRA adapter in PEFT's layout."""


@dataclass(frozen=True)
class LoraAdapter:
    """A checked adapter: its shape-defining settings and, per adapted module, its A and B matrices."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Module name in the base model (``model.layers.0.self_attn.q_proj``) -> (A, B)."""
    target_parameters: tuple[str, ...] = ()
    """Adapted parameters (an MoE model's stacked experts, its router), PEFT's ``target_parameters``."""
    rank_pattern: tuple[tuple[str, int], ...] = ()
    """(PEFT name pattern, rank) of layers whose rank is not ``rank`` (their alpha keeps the scale)."""

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def shape_key(self) -> tuple[Any, ...]:
        """What must be equal for one adapter's tensors to be copied over another's in place."""
        names = tuple(sorted(self.weights))
        return self.rank, self.alpha, self.target_modules, self.target_parameters, self.rank_pattern, names

    def peft_config(self) -> Any:
        """PEFT's LoraConfig for these settings (how an engine injects the adapter's layers)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by alpha / r
            target_modules=list(self.target_modules),
            target_parameters=list(self.target_parameters) or None,
            rank_pattern=dict(self.rank_pattern),
            alpha_pattern={pattern: rank * self.scale for pattern, rank in self.rank_pattern},
            lora_dropout=0.0,
            bias="none",
        )


def is_adapter_dir(directory: Path) -> bool:
    return (directory / CONFIG_FILE).is_file()


def _read_config(directory: Path) -> dict[str, Any]:
    """``adapter_config.json`` as a JSON object; AdapterError (one line) when it is not one."""
    try:
        content = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{directory / CONFIG_FILE} cannot be read as JSON ({exc})") from exc
    if not isinstance(content, dict):
        raise AdapterError(f"{directory / CONFIG_FILE} is not a JSON object")
    return content


def adapter_base(directory: Path) -> str:
    """The base model an adapter was trained on, as its config names it (a path or a model name)."""
    base = _read_config(directory).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise AdapterError(f"{directory / CONFIG_FILE} names no base_model_name_or_path; evaluate the merged model")
    return base


@dataclass(frozen=True)
class _Settings:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    target_parameters: tuple[str, ...]
    rank_pattern: tuple[tuple[str, int], ...]


def _names(directory: Path, key: str, value: Any, required: bool) -> tuple[str, ...]:
    """A list of names (PEFT also allows one string) as a sorted tuple; AdapterError when it is something else."""
    if value is None and not required:
        return ()
    if isinstance(value, str):
        value = [value]
    ok = (
        isinstance(value, list)
        and len(value) <= MAX_NAMES
        and all(isinstance(n, str) and 0 < len(n) <= 200 for n in value)
    )
    if not ok or (required and not value):
        raise AdapterError(f"{directory}: {key}={value!r} is not a list of module names")
    return tuple(sorted(set(value)))


def _is_number(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low < value < high


def _patterns(directory: Path, content: dict[str, Any], rank: int, alpha: float) -> tuple[tuple[str, int], ...]:
    """``rank_pattern`` checked against ``alpha_pattern``: every pattern keeps the adapter's one scale alpha / r."""
    ranks, alphas = content.get("rank_pattern") or {}, content.get("alpha_pattern") or {}
    if not isinstance(ranks, dict) or not isinstance(alphas, dict) or len(ranks) > MAX_NAMES:
        raise AdapterError(f"{directory}: rank_pattern and alpha_pattern must be objects of pattern -> number")
    for pattern in set(ranks) | set(alphas):
        pattern_rank, pattern_alpha = ranks.get(pattern, rank), alphas.get(pattern, alpha)
        if not isinstance(pattern_rank, int) or not _is_number(pattern_rank, 0, MAX_RANK + 1):
            raise AdapterError(f"{directory}: rank_pattern[{pattern!r}]={pattern_rank!r} is not a rank")
        if not _is_number(pattern_alpha, 0, 1e6) or abs(pattern_alpha / pattern_rank - alpha / rank) > 1e-9 * alpha:
            scale = f"alpha/r of {pattern_alpha!r}/{pattern_rank!r}"
            raise AdapterError(
                f"{directory}: {pattern!r} has {scale}, not the adapter's {alpha}/{rank}; not plain LoRA"
            )
    return tuple(sorted((pattern, ranks.get(pattern, rank)) for pattern in set(ranks) | set(alphas)))


def _config(directory: Path) -> _Settings:
    content = _read_config(directory)
    if content.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{directory} holds a {content.get('peft_type')} adapter; only LoRA adapters are served")
    for key, plain in _SAME_AS_NONE.items():
        value = content.get(key, plain)
        if value != plain and not (plain is None and value in ([], {})) and not (plain == {} and value is None):
            raise AdapterError(f"{directory}: {key}={value!r} is not plain LoRA; export the adapter without it")
    rank, alpha = content.get("r"), content.get("lora_alpha")
    if not isinstance(rank, int) or not _is_number(rank, 0, MAX_RANK + 1):
        raise AdapterError(f"{directory}: rank r={rank!r} is not an integer in [1, {MAX_RANK}]")
    if not isinstance(alpha, (int, float)) or not _is_number(alpha, 0, 1e6):
        raise AdapterError(f"{directory}: lora_alpha={alpha!r} is not a positive number")
    return _Settings(
        rank=rank,
        alpha=float(alpha),
        target_modules=_names(directory, "target_modules", content.get("target_modules"), required=True),
        target_parameters=_names(directory, "target_parameters", content.get("target_parameters"), required=False),
        rank_pattern=_patterns(directory, content, rank, float(alpha)),
    )


def read_adapter(directory: Path) -> LoraAdapter:
    """The adapter in ``directory``, checked: plain LoRA, every adapted module with an A (r x in) and a B (out x r)
    (E*r and r*E for E stacked experts), finite values, nothing else in the file. Raises :class:`AdapterError`
    (one line) otherwise; whether the shapes fit the base is the engine's check when it loads the adapter."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    settings = _config(directory)
    ranks = {settings.rank} | {rank for _, rank in settings.rank_pattern}
    try:
        tensors = load_file(str(directory / WEIGHTS_FILE))
    except (OSError, SafetensorError) as exc:
        raise AdapterError(f"{directory / WEIGHTS_FILE} cannot be read as safetensors ({exc})") from exc
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, _, leaf = name.removeprefix(PEFT_PREFIX).rpartition(".")
        module, _, part = module.rpartition(".")
        if not name.startswith(PEFT_PREFIX) or leaf != "weight" or part not in _PARTS or not module:
            raise AdapterError(f"{directory}: tensor {name!r} is not a LoRA weight in PEFT's layout")
        if tensor.dim() != 2 or not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise AdapterError(f"{directory}: tensor {name!r} is not a finite floating-point matrix")
        parts.setdefault(module, {})[part] = tensor
    if not parts:
        raise AdapterError(f"{directory}: {WEIGHTS_FILE} holds no LoRA weights")
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, pair in sorted(parts.items()):
        if set(pair) != set(_PARTS):
            raise AdapterError(f"{directory}: module {module} has {sorted(pair)} but needs lora_A and lora_B")
        a, b = pair["lora_A"], pair["lora_B"]
        inner = a.shape[0]
        stacked = settings.target_parameters and any(inner % rank == 0 for rank in ranks)
        if inner != b.shape[1] or not (inner in ranks or stacked):
            shapes = f"A {tuple(a.shape)}, B {tuple(b.shape)}"
            raise AdapterError(f"{directory}: module {module} has {shapes}, not rank {settings.rank}")
        weights[module] = (a, b)
    return LoraAdapter(
        rank=settings.rank,
        alpha=settings.alpha,
        target_modules=settings.target_modules,
        weights=weights,
        target_parameters=settings.target_parameters,
        rank_pattern=settings.rank_pattern,
    )
