"""Trainer checkpoints for exact resume, and export of the policy as an HF checkpoint directory.

A trainer checkpoint ``<dir>/step_<n>/`` holds the full (unsharded) model and optimizer state (a LoRA
model's trainable adapters alone: the frozen base is the start checkpoint's),
the scheduler state and step in ``trainer_state.pt`` (written by rank 0), with the breakers' history of gradient
norms and the trained state of each older policy version the trainer keeps to recompute behaviour
log-probabilities (:mod:`trainer.behaviour`), and each rank's RNG states in ``rng_rank<r>.pt``. Full state
dicts make it independent of the world size: a run saved with 2 ranks resumes on 1 and vice versa. ``latest``
names the newest complete one (written last, so a crash mid-save never points at half a checkpoint).
:func:`prune_checkpoints` keeps the newest few.

The exported policy is what SHARDCAST's origin publishes and what HF and vLLM load:
``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer files, and a
vision-language policy's ``preprocessor_config.json`` (its image processor, by which engines know to load
it as one and process its images alike).
The weights are in the architecture's checkpoint layout, the one ``save_pretrained`` writes and
both engines read, which is not always the module layout the trainer holds: Qwen3-MoE's experts
are one fused 3-D tensor per block in ``transformers`` but one tensor per expert on disk (see
:func:`checkpoint_tensors`). A LoRA policy exports as its adapter (:func:`export_adapter`, PEFT's
layout) and, for the run's result, as the merged checkpoint (:func:`export_policy`, which folds a LoRA
model's adapters into its weights).
"""

from __future__ import annotations

import copy
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engines.adapters import CONFIG_FILE as ADAPTER_CONFIG_FILE
from engines.adapters import WEIGHTS_FILE as ADAPTER_WEIGHTS_FILE
from trainer.config import TrainerSection
from trainer.fsdp import DistInfo, barrier
from trainer.lora import (
    adapter_config_json,
    adapter_file_name,
    adapter_tensors,
    base_model,
    is_lora,
    lora_sites,
    merged_tensors,
    trained_names,
)
from trainer.model import DTYPES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from engines.vision import VisionInputs

LATEST_FILE = "latest"
STATE_FILE = "trainer_state.pt"


@dataclass
class TrainerState:
    """What exact resume needs besides model and optimizer: the step, the scheduler, the breakers' history and the
    kept policy versions."""

    step: int
    scheduler: dict[str, Any]
    grad_norms: list[float] = field(default_factory=list)
    """Pre-clip gradient norms of the last applied RL steps (:mod:`trainer.breakers`)."""
    behaviour: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Policy version -> its full trained state (older versions only; rank 0 holds the tensors)."""


def _full_state_options(info: DistInfo, loading: bool, trainable_only: bool = False) -> Any:
    """Full (unsharded) state dicts; ``trainable_only``: without frozen parameters (a LoRA model's base), and
    loading such a state leaves them as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(
        full_state_dict=True,
        cpu_offload=info.is_distributed,
        broadcast_from_rank0=loading and info.is_distributed,
        ignore_frozen_params=trainable_only,
        strict=not trainable_only,
    )


def full_model_state(model: nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """The unsharded model state dict (on rank 0; other ranks get an empty dict when distributed)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_full_state_options(info, loading=False))
    return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState, info: DistInfo
) -> Path:
    """Write the trainer state of ``state.step`` under ``directory``; returns the step's folder."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = directory / f"step_{state.step}"
    options = _full_state_options(info, loading=False, trainable_only=is_lora(model))
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if info.is_main:
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        payload = {
            "model": model_state,
            "optimizer": optim_state,
            "step": state.step,
            "scheduler": state.scheduler,
            "grad_norms": state.grad_norms,
            "behaviour": state.behaviour,
        }
        torch.save(payload, target / STATE_FILE)
    barrier(info)
    torch.save(_rng_state(), target / f"rng_rank{info.rank}.pt")
    barrier(info)
    if info.is_main:
        (directory / LATEST_FILE).write_text(target.name + "\n")
    barrier(info)
    return target


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete trainer checkpoint under ``directory``, if any."""
    marker = directory / LATEST_FILE
    if not marker.is_file():
        return None
    target = directory / marker.read_text().strip()
    return target if (target / STATE_FILE).is_file() else None


def prune_checkpoints(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints under ``directory``, never the one ``latest`` names."""
    found = sorted(
        (p for p in directory.glob("step_*") if p.name.removeprefix("step_").isdigit()),
        key=lambda p: int(p.name.removeprefix("step_")),
    )
    latest = latest_checkpoint(directory)
    doomed = [p for p in found[: max(0, len(found) - keep)] if latest is None or p.name != latest.name]
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)
    return doomed


def load_checkpoint(target: Path, model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> TrainerState:
    """Restore model, optimizer and this rank's RNG from ``target``; returns step and scheduler state."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    payload: dict[str, Any] = {}
    if info.is_main or not info.is_distributed:
        payload = torch.load(target / STATE_FILE, map_location="cpu", weights_only=False)
    options = _full_state_options(info, loading=True, trainable_only=is_lora(model))
    # Two calls, not set_state_dict: given an empty model dict (every rank but 0 when broadcasting),
    # set_state_dict loads only the optimizer there, while rank 0 broadcasts the model: a hang or a crash.
    set_model_state_dict(model, payload.get("model", {}), options=options)
    set_optimizer_state_dict(model, optimizer, payload.get("optimizer", {}), options=options)
    behaviour: dict[int, dict[str, torch.Tensor]] = payload.get("behaviour", {})
    meta = [payload.get("step"), payload.get("scheduler"), payload.get("grad_norms", []), sorted(behaviour)]
    if info.is_distributed:
        import torch.distributed as dist

        dist.broadcast_object_list(meta, src=0)
    rng_file = target / f"rng_rank{info.rank}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    step, scheduler, grad_norms, versions = meta
    assert isinstance(step, int) and isinstance(scheduler, dict) and isinstance(versions, list)
    # every rank learns which versions there are; rank 0 alone holds their tensors (it broadcasts them on loading)
    behaviour = {version: behaviour.get(version, {}) for version in versions}
    return TrainerState(step=step, scheduler=scheduler, grad_norms=list(grad_norms), behaviour=behaviour)


def trainable_model_state(model: nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """The unsharded state of the parameters that train, a copy (on rank 0; other ranks get an empty dict when
    distributed). On one process the state dict holds the parameters themselves: copied, so it stays what it is."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_full_state_options(info, loading=False, trainable_only=True))
    return {name: value.detach().clone() for name, value in state.items() if isinstance(value, torch.Tensor)}


def set_trainable_state(model: nn.Module, state: dict[str, torch.Tensor], info: DistInfo) -> None:
    """Load ``state`` (:func:`trainable_model_state`'s, given on rank 0) into the parameters that train."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    values: dict[str, Any] = dict(state)
    set_model_state_dict(model, values, options=_full_state_options(info, loading=True, trainable_only=True))


def load_policy_weights(model: nn.Module, policy_dir: Path, config: TrainerSection, info: DistInfo) -> None:
    """Load an exported policy's weights into the parameters that train: a full HF checkpoint directory (rank 0 reads
    it; the frozen parameters keep their own values), or a LoRA run's adapter directory. Every rank must call."""
    state: dict[str, torch.Tensor] = {}
    if info.is_main or not info.is_distributed:
        state = _policy_state(model, policy_dir, config)
    set_trainable_state(model, state, info)


def _policy_state(model: nn.Module, policy_dir: Path, config: TrainerSection) -> dict[str, torch.Tensor]:
    """The trained state held in ``policy_dir``, in ``model``'s own names."""
    from safetensors.torch import load_file

    from trainer.model import load_model

    trained = trained_names(model)
    if is_lora(model):
        files = load_file(str(policy_dir / ADAPTER_WEIGHTS_FILE))
        names = {file_name: name for name in trained if (file_name := adapter_file_name(name))}
        missing = set(names) - set(files)
        if missing:
            raise ValueError(f"{policy_dir} lacks adapter weights {sorted(missing)[:3]}")
        return {name: files[file_name].to(DTYPES[config.dtype]) for file_name, name in names.items()}
    loaded = load_model(str(policy_dir), config.dtype).state_dict()
    missing = set(trained) - set(loaded)
    if missing:
        raise ValueError(f"{policy_dir} lacks weights {sorted(missing)[:3]} of the trained model")
    return {name: loaded[name].detach() for name in trained}


def checkpoint_tensors(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (the model's own names and shapes) in the on-disk layout ``save_pretrained`` writes.

    ``transformers`` converts some architectures' weights on load (fused MoE experts) and back on
    save; this is that reverse conversion. A tied model's output head is left out, as
    ``save_pretrained`` leaves it: it is the input embedding, and safetensors refuses one tensor
    stored under two names.
    """
    from transformers.core_model_loading import revert_weight_conversion

    config: Any = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        head: Any = getattr(model, "get_output_embeddings", lambda: None)()
        head_names = {name + ".weight" for name, module in model.named_modules() if module is head}
        state = {name: tensor for name, tensor in state.items() if name not in head_names}
    converted: dict[str, torch.Tensor] = revert_weight_conversion(model, state)
    return converted


def export_policy(
    directory: Path,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    info: DistInfo,
    dtype: str = "float32",
    vision: VisionInputs | None = None,
) -> Path:
    """Write the policy as an HF checkpoint directory (rank 0 writes; every rank must call); a LoRA model's
    adapters are merged into its weights, and a vision-language one's image processor (``vision``) goes with it."""
    from safetensors.torch import save_file

    state = full_model_state(model, info)
    if info.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        if is_lora(model):  # the base with the adapters folded in, in the base model's names
            state = merged_tensors(state, lora_sites(model))
            model = base_model(model)
        tensors = {
            name: t.detach().to("cpu", DTYPES[dtype]).contiguous()
            for name, t in checkpoint_tensors(model, state).items()
        }
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        config: Any = copy.deepcopy(model.config)
        config.dtype = DTYPES[dtype]
        config.save_pretrained(str(directory))
        generation_config: Any = getattr(model, "generation_config", None)
        if generation_config is not None:
            generation_config.save_pretrained(str(directory))
        tokenizer.save_pretrained(str(directory))
        if vision is not None:
            vision.processor.save_pretrained(str(directory))
    barrier(info)
    return directory


def export_adapter(directory: Path, model: nn.Module, info: DistInfo, dtype: str = "float32") -> Path:
    """Write a LoRA model's adapter in PEFT's layout (rank 0 writes; every rank must call)."""
    import json

    from safetensors.torch import save_file

    state = full_model_state(model, info)
    if info.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {name: t.detach().to("cpu", DTYPES[dtype]).contiguous() for name, t in adapter_tensors(state).items()}
        save_file(tensors, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
        text = json.dumps(adapter_config_json(model), indent=2, sort_keys=True) + "\n"
        (directory / ADAPTER_CONFIG_FILE).write_text(text)
    barrier(info)
    return directory
