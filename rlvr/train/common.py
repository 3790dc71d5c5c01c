"""Plumbing shared by the trainers: optimizer + schedule, timing, seeding, run directories.

Kept out of the trainer files so each of them reads as its story.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
import torch

from rlvr.config import check_range, save_config
from rlvr.model.checkpoint import load_trainer_state, rng_state, set_rng_state


@dataclass
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Decay after warm-up, down to `min_lr_ratio * lr` at the last step."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak (cosine / linear)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    master_weights: bool = False
    """For a model in bf16/fp16 (``model_load.dtype``): AdamW steps float32 master copies of the
    trainable weights (and keeps float32 moments), the model gets the rounded result after each
    step. Off: AdamW steps the weights in their own dtype, with moments in that dtype (bf16 AdamW
    states: the least memory). No effect on a float32 model."""

    def __post_init__(self) -> None:
        check_range("optim.lr", self.lr, 0.0)
        check_range("optim.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_range("optim.warmup_steps", self.warmup_steps, 0)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """AdamW (no decay on norms/biases) and a LambdaLR warm-up + decay schedule.

    AdamW runs fused (one kernel over each parameter and its two moments) where torch has the
    kernel for the parameters' device and dtype (CPU and CUDA, float types): the same update as
    the default multi-tensor one up to float rounding, and the same ``state_dict``, so a
    checkpoint resumes either way. Measured on 2 CPU cores: 7.1 -> 3.9 ms per step on the 2.7M
    benchmark model, 202 -> 22 ms on the 24M one (``docs/training_step.md``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    masters = cfg.master_weights and any(p.dtype != torch.float32 for p in params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kind = MasterWeightAdamW if masters else torch.optim.AdamW
    opt = kind(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=fused_adamw_supported(params) or None)

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(total_steps - cfg.warmup_steps, 1)
        progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
        if cfg.schedule == "cosine":
            shape = 0.5 * (1 + math.cos(math.pi * progress))
        else:
            shape = 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def fused_adamw_supported(params: list[torch.Tensor]) -> bool:
    """True when torch's fused AdamW kernel covers these parameters: all floating point, all on
    one device type that has the kernel (CPU, CUDA, ...)."""
    try:  # torch's own list; private, so a torch without it gets the default AdamW
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
        supported = set(_get_fused_kernels_supported_devices())
    except ImportError:
        return False
    devices = {p.device.type for p in params}
    return bool(params) and len(devices) == 1 and devices <= supported and all(torch.is_floating_point(p) for p in params)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over float32 master copies of low-precision weights (mixed-precision training).

    ``load_grads`` moves the model's gradients into the masters (float32; the model's own are
    freed); ``step`` steps the masters and copies them, rounded, into the model. The masters are
    part of ``state_dict``, so a resumed run continues from the exact float32 weights, not from
    the rounded ones."""

    def __init__(self, groups: list[dict], **kw) -> None:
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        master_groups = []
        for g in groups:
            masters = [p.detach().float().clone().requires_grad_(True) for p in g["params"]]
            self.pairs += list(zip(g["params"], masters))
            master_groups.append({**g, "params": masters})
        super().__init__(master_groups, **kw)

    @property
    def masters(self) -> list[torch.Tensor]:
        return [m for _, m in self.pairs]

    @torch.no_grad()
    def load_grads(self) -> None:
        for p, m in self.pairs:
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None  # past here only the float32 copy is read: one gradient copy at the step's peak, not two

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for p, m in self.pairs:
            p.copy_(m)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p, _ in self.pairs:
            p.grad = None

    def state_dict(self) -> dict:
        return {**super().state_dict(), "masters": [m.detach().clone() for m in self.masters]}

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop("masters", None)
        super().load_state_dict(state_dict)
        if masters is not None:
            with torch.no_grad():
                for (p, m), saved in zip(self.pairs, masters):
                    m.copy_(saved)
                    p.copy_(saved)


def clip_and_step(model, opt, sched, grad_clip: float) -> float:
    """Clip gradients, step optimizer and schedule; return the pre-clip gradient norm (in float32
    over the master copies when the optimizer keeps them; over the whole gradient when it is
    sharded across ranks: a collective)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(opt, MasterWeightAdamW):
        opt.load_grads()
        params = opt.masters
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # sharded (FSDP2) gradients: the whole gradient's norm
        norm = norm.full_tensor()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return float(norm)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Timer:
    """Accumulates wall seconds per named phase: ``with timer("rollout"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        self.seconds = {}
        return out


def prepare_run_dir(out: str | Path, cfg) -> Path:
    """Create the run directory and write the resolved config into it."""
    run_dir = Path(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    return run_dir


def training_state(step: int, optimizer, scheduler, generator: torch.Generator, **extra) -> dict:
    """What a resumable checkpoint holds besides the model: step, optimizer, schedule, RNGs, extras."""
    return {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "generator": generator.get_state(), "rng": rng_state(), **extra}


def restore_training_state(ckpt: Path, optimizer, scheduler, generator: torch.Generator) -> dict:
    """Load a checkpoint's trainer state into the objects and return it (for step and extras)."""
    state = load_trainer_state(ckpt)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    set_rng_state(state["rng"])
    return state
