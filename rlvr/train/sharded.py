"""Sharded training with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) and
world-size-independent checkpoints with ``torch.distributed.checkpoint`` (DCP)
(docs/distributed.md, "Sharded training (FSDP2)").

Data parallel (``rlvr.train.distributed``) keeps the whole model and optimizer on every rank.
Here each rank keeps 1/N of every parameter (a ``DTensor`` sharded on dim 0 over a 1-D device
mesh), so the optimizer state that AdamW builds from those parameters is 1/N too. Each decoder
layer is one FSDP unit (its parameters are all-gathered for its forward and backward, then
freed), the root is another (embeddings, final norm, head). The gradients are reduce-scattered
and averaged over the ranks: a rank's loss must be the mean over its own share of the global
batch for the averaged gradient to be the one-process gradient of the global mean.

Works on CPU over gloo in the torch this project pins (2.13), tested with 2 processes
(tests/test_sharded.py): the loss, the gradient shards and the AdamW step equal one process's;
the bf16 mixed precision policy runs; a peft LoRA model (frozen base, trainable adapters in the
same unit) shards and trains.

Checkpoints: ``save_checkpoint`` writes model and optimizer state with DCP from every rank, keyed
by parameter name (``get_state_dict``), so they do not depend on the world size;
``load_checkpoint`` reads them into a model sharded over any number of ranks or into a plain
model in a process without a process group (DCP then reads in that one process).

A run's checkpoints (``save_sharded_checkpoint``, ``restore_sharded``) are that DCP directory
beside rank 0's trainer state, published atomically like ``rlvr.model.checkpoint``'s.

`rlvr sft` uses it under torchrun with `sft.shard: true` (`rlvr.train.sft_parallel`), `rlvr train`
with `distributed.shard: true` (`rlvr.train.policy`, `rlvr.train.grpo`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlvr.errors import ConfigError
from rlvr.model.checkpoint import CHECKPOINTS, MARKER, TRAINER_STATE, load_trainer_state, set_rng_state, write_manifest
from rlvr.train.compiled import decoder_layers
from rlvr.train.distributed import barrier


def find_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM, also under a peft wrapper (its base model);
    a model without them is refused (sharding only the root would keep every weight whole in
    each forward)."""
    layers = decoder_layers(model)
    if layers is None and hasattr(model, "get_base_model"):
        layers = decoder_layers(model.get_base_model())
    if layers is None:
        raise ValueError(f"shard_model: no decoder layers found in {type(model).__name__} "
                         "(expected a Hugging Face causal LM with <base_model_prefix>.layers)")
    return layers


def device_mesh(mesh_or_group: DeviceMesh | dist.ProcessGroup | None = None,
                device_type: str = "cpu") -> DeviceMesh:
    """A 1-D mesh: ``mesh_or_group`` itself if a mesh, built from a process group, or over the
    default group (which must be initialized)."""
    if isinstance(mesh_or_group, DeviceMesh):
        return mesh_or_group
    if not dist.is_initialized():
        raise RuntimeError("shard_model needs an initialized process group (torchrun + init_process_group)")
    if mesh_or_group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    return DeviceMesh.from_group(mesh_or_group, device_type)


def mixed_precision_policy(enabled: bool) -> MixedPrecisionPolicy:
    """bf16 parameters for the forward and backward (the sharded fp32 parameters stay the
    optimizer's masters), gradients reduced in fp32; fp32 throughout when not ``enabled``."""
    if not enabled:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_for_training(model: torch.nn.Module, master_weights: bool = False) -> bool:
    """``shard_model`` before the optimizer is built; with ``master_weights`` and a trainable
    parameter not in float32 (a bf16 model), upcast first and shard with bf16 mixed precision (the
    float32 shards are the masters). Whether it did (the checkpoints record it)."""
    mixed = master_weights and any(p.dtype != torch.float32 for p in model.parameters() if p.requires_grad)
    if mixed:
        model.float()
    shard_model(model, mixed_precision=mixed)
    return mixed


def shard_model(model: torch.nn.Module, mesh_or_group: DeviceMesh | dist.ProcessGroup | None = None, *,
                mixed_precision: bool = False, reshard_after_forward: bool = True) -> torch.nn.Module:
    """``fully_shard`` each decoder layer of ``model`` and then the root, in place; returns the
    model (its parameters are now dim-0 ``DTensor`` shards). Build the optimizer afterwards.

    ``mesh_or_group``: a 1-D ``DeviceMesh``, a process group, or None (the default group); the
    mesh's device type must be the model's (``cpu`` with gloo). ``mixed_precision``: bf16 compute,
    fp32 gradient reduction (``mixed_precision_policy``). ``reshard_after_forward``: free each
    layer's gathered weights after its forward (gathered again for its backward); False keeps them
    until the backward, trading memory for one all-gather per layer.

    A peft LoRA model shards as is: each layer unit holds frozen base weights and trainable
    adapters together, which FSDP2 accepts (only the adapters get gradients)."""
    device_type = next(model.parameters()).device.type
    mesh = device_mesh(mesh_or_group, device_type)
    if mesh.ndim != 1:
        raise ValueError(f"shard_model: a 1-D mesh is needed, got {mesh.ndim} dimensions")
    if mesh.device_type != device_type:
        raise ValueError(f"shard_model: mesh on {mesh.device_type}, model on {device_type}")
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError("shard_model: the model is already sharded")
    policy = mixed_precision_policy(mixed_precision)
    for layer in find_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


@contextlib.contextmanager
def _single_process_quietly() -> Iterator[None]:
    """DCP warns on every read or write without a process group ("assuming the intent is to load
    in a single process"); here that is the intent, so the warning is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Write ``model``'s (and ``optimizer``'s) state to the DCP directory ``path``; under a process
    group every rank calls it and writes its own shards (a shared filesystem across nodes). Keys
    are parameter names, so any world size, or one plain process, can load it."""
    with _single_process_quietly():
        dcp.save(_state(model, optimizer), checkpoint_id=str(path))


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Read the DCP directory ``path`` into ``model`` (and ``optimizer``, built over the model's
    current parameters) in place: a model sharded with ``shard_model`` on any number of ranks
    (every rank calls it), or a plain model in a process with no process group."""
    state = _state(model, optimizer)
    with _single_process_quietly():
        dcp.load(state, checkpoint_id=str(path))
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict as plain CPU tensors on every rank (sharded parameters
    all-gathered: a collective, every rank must call it). For export or comparison, not for
    checkpoints of large models."""
    out = {}
    for name, t in model.state_dict().items():
        if isinstance(t, DTensor):
            t = t.full_tensor()
        out[name] = t.detach().cpu().clone()
    return out


def _bytes(t) -> int:
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def local_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """This rank's parameter and optimizer-state bytes: the local shard of every ``DTensor``
    (the whole tensor of a plain one). ``{"params", "optimizer", "total"}``."""
    params = sum(_bytes(p) for p in model.parameters())
    optim = 0
    if optimizer is not None:
        optim = sum(_bytes(v) for state in optimizer.state.values() for v in state.values())
    return {"params": params, "optimizer": optim, "total": params + optim}


# ---------------------------------------------------------------------------------------------
# A run's sharded checkpoints (``rlvr sft`` and ``rlvr train`` with sharding): DCP + trainer state

DCP_DIR = "dcp"


def is_sharded_checkpoint(ckpt: Path) -> bool:
    return (Path(ckpt) / DCP_DIR).is_dir()


def save_sharded_checkpoint(run_dir: Path, step: int, model, opt, state: dict, is_main: bool, *, lora: bool,
                            mixed_precision: bool, extra: Callable[[Path], None] | None = None) -> Path:
    """``run_dir/checkpoints/step_N/``: ``dcp/`` (model and optimizer, every rank its shards) and
    rank 0's ``trainer_state.pt`` (``state`` without its optimizer, which is in the shards, and
    with ``lora`` and ``mixed_precision`` for ``check_sharded_resume``) and ``extra(directory)`` (a
    step component's files), manifest and marker, published by one rename; every rank calls it and
    gets the path."""
    state = {**{k: v for k, v in state.items() if k != "optimizer"}, "lora": lora, "mixed_precision": mixed_precision}
    parent = Path(run_dir) / CHECKPOINTS
    final = parent / f"step_{step}"
    tmp = parent / f".tmp-step_{step}-sharded"  # the same name on every rank
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    save_checkpoint(tmp / DCP_DIR, model, opt)
    barrier()  # every rank's shards are written
    if is_main:
        torch.save(state, tmp / TRAINER_STATE)
        if extra is not None:
            extra(tmp)
        write_manifest(tmp)
        with open(tmp / MARKER, "w") as f:  # last: its presence means all else is there
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    barrier()
    return final


def restore_sharded(ckpt: Path, model, opt, sched, generator: torch.Generator) -> dict:
    """Load a sharded checkpoint into ``model`` and ``opt`` (sharded over any world size, or plain
    in one process), the schedule, generator and RNGs; returns the trainer state (step, order ...)."""
    load_checkpoint(Path(ckpt) / DCP_DIR, model, opt)
    state = load_trainer_state(ckpt)
    sched.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    set_rng_state(state["rng"])
    return state


def check_sharded_resume(ckpt: Path | None, *, lora: bool, sharded: bool, shard_key: str) -> bool:
    """Whether the checkpoint ``ckpt`` (None: a fresh run) is sharded; ``ConfigError`` naming the
    key where it cannot resume this run: a sharded run (``sharded``) needs a sharded checkpoint; a
    sharded one resumes only into the same kind of policy (LoRA or full weights), and one with
    float32 masters under FSDP2's bf16 policy only sharded (its optimizer state is plain AdamW's
    over float32 weights, not ``MasterWeightAdamW``'s)."""
    if ckpt is None:
        return False
    if not is_sharded_checkpoint(ckpt):
        if sharded:
            raise ConfigError(f"{shard_key}: {ckpt} is not a sharded checkpoint; resume it without {shard_key}")
        return False
    state = load_trainer_state(ckpt)
    if state.get("mixed_precision", False) and not sharded:
        raise ConfigError(f"{ckpt} is a sharded checkpoint with float32 masters (optim.master_weights): resume it "
                          f"with {shard_key}=true under torchrun")
    saved = bool(state.get("lora", False))
    if saved != lora:
        kind = "a LoRA run's (adapters on a frozen base)" if saved else "a full-weights run's"
        raise ConfigError(f"{ckpt} is {kind} sharded checkpoint: resume it with lora.enabled={str(saved).lower()}")
    return True
