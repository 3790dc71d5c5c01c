"""The step's model components beside the policy: the KL reference, the teacher, the critic.

Each is a ``StepComponent``: built from the config when it is on (``STEP_COMPONENTS``, keyed by
the names of the compatibility table, ``rlvr.train.compat``), it says what it adds to a step's
prepared batch, what it keeps in a checkpoint and how it behaves across ranks:

    prepare(batch)        no-grad forwards on the kept samples at the weights that sampled them,
                          before any optimizer step: {field of ``Prepared``: tensor}
    after_update(...)     its own training after the policy's (the critic); others nothing
    save(directory)       its state inside the policy's atomic checkpoint (the critic's model,
                          optimizer and schedule); others nothing

Across torchrun ranks: every rank prepares the whole batch (the reference and the teacher are
frozen, so they agree without talking); the critic's update is data parallel like the policy's
(``Critic.update``'s all-reduce). The policy itself, full weights or a LoRA adapter, is
``rlvr.train.policy.Policy``; the sample filters (dynamic sampling, curriculum refill) belong to
the rollout source (``rlvr.rollout.sync_rollout``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from rlvr.registry import Registry
from rlvr.train.critic import CRITIC_DIR, Critic
from rlvr.train.grpo_config import GRPOConfig, uses_critic
from rlvr.train.policy import Policy
from rlvr.train.teacher import load_teacher
from rlvr.train.update import frozen_logprobs
from rlvr.types import Batch


class StepComponent(Protocol):
    name: str

    def prepare(self, batch: Batch) -> dict[str, torch.Tensor]:
        """What this component adds to the step's prepared batch (``Prepared`` field -> [B, T])."""
        ...

    def after_update(self, batch: Batch, returns: torch.Tensor | None, values: torch.Tensor | None,
                     generator: torch.Generator) -> dict[str, float]:
        """Its own training after the policy's update; its metrics."""
        ...

    def save(self, directory: Path) -> None:
        """Its state, written inside the checkpoint directory ``directory``."""
        ...


@dataclass
class Setup:
    """What a component's builder gets: the run's config, its policy, device and the checkpoint
    being resumed (None: a fresh run)."""

    cfg: GRPOConfig
    policy: Policy
    device: torch.device
    ckpt: Path | None
    updates_per_step: int


class Frozen:
    """A frozen model's log-probs as one ``Prepared`` field: the KL reference (a second copy of
    the start model, or the LoRA policy with its adapters off) or the teacher."""

    def __init__(self, name: str, field: str, forward: Callable[[Batch], torch.Tensor],
                 model: torch.nn.Module | None = None) -> None:
        self.name, self.field, self.forward = name, field, forward
        self.model = model  # the frozen module; None when it is the policy's own weights (LoRA, adapters off)

    def prepare(self, batch: Batch) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {self.field: self.forward(batch)}

    def after_update(self, batch, returns, values, generator) -> dict[str, float]:
        return {}

    def save(self, directory: Path) -> None:
        """Frozen: nothing to keep."""


class CriticPart:
    """PPO's learned critic (``algo.advantage: gae``): its values before the advantages, its
    epochs towards the returns after the policy's update, its state in each checkpoint."""

    name = "critic"

    def __init__(self, critic: Critic, cfg: GRPOConfig) -> None:
        self.critic, self.cfg = critic, cfg

    def prepare(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {"values": self.critic.values(batch.input_ids, batch.attention_mask, self.cfg.algo.microbatch_size,
                                             batch.loss_mask)}

    def after_update(self, batch: Batch, returns, values, generator) -> dict[str, float]:
        a = self.cfg.algo
        return self.critic.update(batch.input_ids, batch.attention_mask, batch.loss_mask, returns, values, generator,
                                  minibatch_size=a.minibatch_size, microbatch_size=a.microbatch_size,
                                  bucket_mb=self.cfg.distributed.bucket_mb)

    def save(self, directory: Path) -> None:
        self.critic.save(directory / CRITIC_DIR)


STEP_COMPONENTS: Registry[Callable[[Setup], StepComponent | None]] = Registry("step component")


@STEP_COMPONENTS.register("kl_reference")
def _reference(s: Setup) -> StepComponent | None:
    """``algo.kl_coef`` > 0: the start model, frozen; with LoRA the policy with its adapters off
    (no second model in memory)."""
    cfg = s.cfg
    if not cfg.algo.kl_coef > 0:
        return None
    loaded = s.policy.load_reference(device=s.device, options=cfg.model_load)  # None with LoRA: adapters off

    def reference(batch: Batch) -> torch.Tensor:
        with s.policy.reference(loaded) as ref:
            return frozen_logprobs(ref, batch, cfg.algo)
    return Frozen("kl_reference", "ref_logprobs", reference, loaded)


@STEP_COMPONENTS.register("teacher")
def _teacher(s: Setup) -> StepComponent | None:
    """``distill.teacher``: frozen, on the policy's device."""
    cfg = s.cfg
    if not cfg.distill.enabled:
        return None
    teacher = load_teacher(cfg.distill, cfg.model, s.policy.tokenizer, device=s.device, options=cfg.model_load)
    return Frozen("teacher", "teacher_logprobs", lambda batch: frozen_logprobs(teacher, batch, cfg.algo), teacher)


@STEP_COMPONENTS.register("critic")
def _critic(s: Setup) -> StepComponent | None:
    """``algo.advantage: gae``: fresh from ``critic.model`` (or the start model), or the checkpoint's."""
    cfg = s.cfg
    if not uses_critic(cfg):
        return None
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.samples_per_task
    steps = cfg.steps * cfg.critic.epochs * math.ceil(per_step / (cfg.algo.minibatch_size or per_step))
    kw = dict(device=s.device, total_steps=steps, options=cfg.model_load, precision=cfg.algo.precision,
              master_weights=cfg.optim.master_weights, packing=cfg.algo.packing, share_prompts=cfg.algo.share_prompts)
    critic = Critic.load(s.ckpt / CRITIC_DIR, cfg.critic, **kw) if s.ckpt is not None else \
        Critic.build(cfg.critic, cfg.model, tokenizer=s.policy.tokenizer, **kw)
    return CriticPart(critic, cfg)


def build_components(s: Setup) -> dict[str, StepComponent]:
    """Every registered component the config turns on, by name, in registration order."""
    out = {}
    for name in STEP_COMPONENTS.names():
        part = STEP_COMPONENTS.get(name)(s)
        if part is not None:
            out[name] = part
    return out
