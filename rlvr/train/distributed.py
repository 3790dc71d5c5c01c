"""The data-parallel process group: which rank this process is, and the few collectives the
GRPO loop needs (docs/distributed.md, "Data parallel (torchrun)").

``torchrun --nproc_per_node N -m rlvr.cli train CONFIG`` starts N processes with ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK`` set; ``open_group`` joins them (gloo on CPU, nccl on CUDA). Without
those variables (a plain ``rlvr train``) the run is world size 1, no process group is opened,
and every helper here is the identity, so the single-process path is unchanged.

Every rank holds the same data (the gathered batch, replicated weights and optimizer state);
the collectives are: ``gather`` (each rank's share of a list of Python objects, in rank order),
``all_reduce_grads`` (sum of the ranks' gradients, bucketed per dtype) and ``from_rank0`` (a
value rank 0 computed, e.g. an eval report, sent to the others).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlvr.config import check_choice, check_range

BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class DistributedConfig:
    backend: str = "auto"
    """auto | gloo | nccl: the torch.distributed backend under torchrun (auto: nccl when the
    run's device is CUDA, else gloo). Unused without torchrun."""
    rollout_chunk: int = 0
    """Tasks per rollout chunk: 0 = one rollout over the step's tasks with the run's generator (a
    single process only); N > 0 = the tasks in chunks of N whole groups, each generated with its
    own seed drawn from the run's generator and dealt to the ranks round-robin. Required with
    more than one process; runs with the same value give the same batches at every world size."""

    bucket_mb: float = 64.0
    """Gradient megabytes per all-reduce: gradients are summed over the ranks bucket by bucket, so
    the flat buffer the reduction needs is one bucket, not a second copy of every gradient (DDP's
    ``bucket_cap_mb``, for the same reason)."""

    shard: bool = False
    """Shard the policy over the torchrun ranks with FSDP2 (``rlvr.train.sharded``): each rank keeps
    1/N of its parameters, gradients and AdamW state (LoRA: of the base and the adapters, state for
    the adapters only), checkpoints are DCP and resume at another world size (one plain process
    included). Rollouts, evals and ``final/`` use a plain whole copy per rank, refreshed after each
    update (``Policy.shard``). Needs several processes."""

    def __post_init__(self) -> None:
        check_choice("distributed.backend", self.backend, BACKENDS)
        check_range("distributed.rollout_chunk", self.rollout_chunk, 0)
        check_range("distributed.bucket_mb", self.bucket_mb, 1e-6)


@dataclass(frozen=True)
class Group:
    """This process's place in the data-parallel group (world 1: no process group)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched() -> Group:
    """The rank, world size and local rank torchrun set in the environment (world 1 without)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return Group(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def open_group(cfg: DistributedConfig, device: torch.device) -> Group:
    """Join torchrun's process group (once per process) on the configured backend; a plain run
    (world 1) opens none. ``device`` is this rank's (``rank_device``)."""
    group = launched()
    if group.world == 1 or dist.is_initialized():
        return group
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return group


def rank_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` for a CUDA run under torchrun, else ``device``."""
    group = launched()
    if device.type != "cuda" or group.world == 1:
        return device
    torch.cuda.set_device(group.local_rank)
    return torch.device("cuda", group.local_rank)


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if active():
        dist.barrier()


def gather(items: list) -> list[list]:
    """Every rank's ``items``, in rank order, on every rank (``[items]`` in a single process)."""
    if not active():
        return [items]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, items)
    return out


def from_rank0(fn: Callable[[], Any]) -> Any:
    """``fn()`` run on rank 0 only, its result handed to every rank (a plain call in one process)."""
    if not active():
        return fn()
    box = [fn() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.no_grad()
def all_reduce_grads(params: list[torch.Tensor], bucket_mb: float = 64.0) -> None:
    """Sum the ranks' gradients of ``params`` into every rank's ``.grad``, one flat buffer per
    dtype. A parameter no rank has a gradient for keeps ``grad = None`` (AdamW skips it, as in one
    process); one that some rank lacks counts zeros there."""
    if not active():
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
    dist.all_reduce(has)
    for p, h in zip(params, has.tolist()):
        p.grad = None if h == 0 else (p.grad if p.grad is not None else torch.zeros_like(p))
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        for bucket in buckets(grads, max(1, int(bucket_mb * 2**20) // grads[0].element_size())):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            for g, reduced in zip(bucket, flat.split([g.numel() for g in bucket])):
                g.copy_(reduced.view_as(g))



def buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """``tensors`` in order, cut into runs of at most ``limit`` elements (a larger tensor alone)."""
    out: list[list[torch.Tensor]] = []
    size = limit
    for t in tensors:
        if size + t.numel() > limit:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out
