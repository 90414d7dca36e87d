"""Distributed set-up and FSDP2 sharding: `fully_shard` on each decoder block, then on the root.

Under torchrun (``WORLD_SIZE`` set) the trainer joins a process group, gloo on CPU and NCCL
on CUDA, and shards the model with FSDP2; a plain single process runs unsharded with the same
code path otherwise. Decoder blocks are found generically from the HF model's
``_no_split_modules``, so any HF causal LM shards the same way. Activation checkpointing wraps
each block before sharding, so recomputation happens inside the block's FSDP unit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import ParallelConfig
from trainer.model import DTYPES

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Join torchrun's process group when launched by torchrun; otherwise a single local process."""
    if "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        return DistInfo(rank=0, world_size=1, device=device)
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (HF ``_no_split_modules`` classes, e.g. Qwen2DecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder blocks")
    return blocks


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Wrap every decoder block so its activations are recomputed in backward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    blocks = set(map(id, decoder_blocks(model)))
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in blocks:
                parent.register_module(name, checkpoint_wrapper(child, preserve_rng_state=False))


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """Each decoder block, or its checkpoint wrapper when it has one."""
    blocks = set(map(id, decoder_blocks(model)))
    wrappers = [m for m in model.modules() if id(getattr(m, "_checkpoint_wrapped_module", None)) in blocks]
    wrapped = {id(w._checkpoint_wrapped_module) for w in wrappers}
    return wrappers + [m for m in model.modules() if id(m) in blocks and id(m) not in wrapped]


def shard_model(model: nn.Module, config: ParallelConfig, info: DistInfo) -> nn.Module:
    """Move to the device, checkpoint activations if asked, and FSDP2-shard when distributed."""
    model.to(info.device)
    if config.activation_checkpointing:
        apply_activation_checkpointing(model)
    if not info.is_distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[config.param_dtype] if config.param_dtype else None,
        reduce_dtype=DTYPES[config.reduce_dtype],
    )
    for block in _shard_units(model):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)
    return model


def all_reduce_sum(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a float64 tensor over ranks (identity on one process)."""
    if info.is_distributed:
        values = values.to(info.device)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values.cpu()


def all_reduce_max(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The element-wise maximum of a float64 tensor over ranks (identity on one process)."""
    if info.is_distributed:
        values = values.to(info.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.cpu()


def reshard(model: nn.Module) -> None:
    """Free every unsharded parameter FSDP2 holds (ZeRO-2 keeps them after a forward), so the next forward gathers
    the sharded parameters as they are now; nothing on one process."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def control_group(info: DistInfo) -> Any:
    """A gloo group for small control messages (also beside NCCL): a rank that dies breaks its peers' next
    call at once, on every machine, where an NCCL collective would wait out its timeout."""
    return dist.new_group(backend="gloo") if info.is_distributed else None


def from_main(value: T, info: DistInfo, group: Any) -> T:
    """Rank 0's ``value`` on every rank (``value`` itself on one process), so all ranks take the same branch."""
    if not info.is_distributed:
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    result: T = box[0]
    return result


def barrier(info: DistInfo) -> None:
    if info.is_distributed:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    """Leave the process groups together, after every rank's work is done (call it on success paths only).

    The barrier keeps a rank from tearing down its gloo pairs while a peer still finishes (rank 0
    writing files): seen once in CI as a rank aborting with "terminate called without an active
    exception" at the end of a 2-rank run."""
    if info.is_distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
