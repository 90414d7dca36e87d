"""LoRA adapter directories as engines read them: PEFT's layout, checked before anything is loaded.

An adapter directory holds ``adapter_config.json`` (rank ``r``, ``lora_alpha``, ``target_modules``) and
``adapter_model.safetensors``, whose tensors are named ``base_model.model.<module>.lora_A.weight`` (r x in)
and ``...lora_B.weight`` (out x r) for each adapted linear layer ``<module>`` of the base model. This is
what the trainer exports for a LoRA run (trainer/lora.py), what ``PeftModel.save_pretrained`` writes and
what vLLM loads. :func:`read_adapter` refuses anything else in one line: PEFT features that change the
arithmetic (DoRA, rsLoRA, per-module ranks, extra trained modules) would make the engines and the
trainer compute different policies, so a run's adapters are plain LoRA.
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
_PARTS = ("lora_A", "lora_B")
_SAME_AS_NONE: dict[str, Any] = {
    "use_dora": False,
    "use_rslora": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "bias": "none",
    "layers_to_transform": None,
    "target_parameters": None,
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

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def shape_key(self) -> tuple[int, float, tuple[str, ...], tuple[str, ...]]:
        """What must be equal for one adapter's tensors to be copied over another's in place."""
        return self.rank, self.alpha, self.target_modules, tuple(sorted(self.weights))

    def peft_config(self) -> Any:
        """PEFT's LoraConfig for these settings (how an engine injects the adapter's layers)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by alpha / r
            target_modules=list(self.target_modules),
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


def _config(directory: Path) -> tuple[int, float, tuple[str, ...]]:
    content = _read_config(directory)
    if content.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{directory} holds a {content.get('peft_type')} adapter; only LoRA adapters are served")
    for key, plain in _SAME_AS_NONE.items():
        value = content.get(key, plain)
        if value != plain and not (plain is None and value in ([], {})) and not (plain == {} and value is None):
            raise AdapterError(f"{directory}: {key}={value!r} is not plain LoRA; export the adapter without it")
    rank, alpha, targets = content.get("r"), content.get("lora_alpha"), content.get("target_modules")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_RANK:
        raise AdapterError(f"{directory}: rank r={rank!r} is not an integer in [1, {MAX_RANK}]")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1e6:
        raise AdapterError(f"{directory}: lora_alpha={alpha!r} is not a positive number")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise AdapterError(f"{directory}: target_modules={targets!r} is not a list of module names")
    return rank, float(alpha), tuple(sorted(targets))


def read_adapter(directory: Path) -> LoraAdapter:
    """The adapter in ``directory``, checked: plain LoRA, every adapted module with an A (r x in) and a B (out x r),
    finite values, nothing else in the file. Raises :class:`AdapterError` (one line) otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    rank, alpha, targets = _config(directory)
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
        if a.shape[0] != rank or b.shape[1] != rank:
            shapes = f"A {tuple(a.shape)}, B {tuple(b.shape)}"
            raise AdapterError(f"{directory}: module {module} has {shapes}, not rank {rank}")
        weights[module] = (a, b)
    return LoraAdapter(rank=rank, alpha=alpha, target_modules=targets, weights=weights)
