"""A GRPO step's phases between the rollout and the update, each returning a new, typed value:

    RolloutBatch (rlvr.rollout.source)  -> screened [Scored]    the monitor's detectors
    select_samples(scored)              -> kept [Scored]        zero-variance groups dropped
    prepare(run, kept)                  -> Prepared             collated once; the components'
                                                                no-grad forwards (reference,
                                                                teacher, critic values)
    compute_advantages(p)               -> (Prepared, metrics)  the batch with its advantages
                                                                (and the critic's returns)

Advantages come from the ``ADVANTAGES`` registry: a group estimator over the kept samples'
rewards (less the KL penalty with ``algo.kl_in_reward``), or one that declares it needs the
critic's values (``NEEDS_VALUES``: ``gae``); distillation adds the teacher's per-token signal,
or is the only one (``distill.mode: alone``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlvr.algos.advantages import ADVANTAGES, NEEDS_VALUES, group_has_variance
from rlvr.algos.distill import reverse_kl, reverse_kl_advantages
from rlvr.algos.kl import kl_reward_penalty, masked_kl
from rlvr.train.batching import collate
from rlvr.train.grpo_config import GRPOConfig, uses_critic
from rlvr.types import Batch, Scored

if TYPE_CHECKING:
    from rlvr.train.grpo_setup import Run


@dataclass(frozen=True)
class Prepared:
    """A step's training batch: the kept samples collated once on the trainer's device, with what
    the advantages and the loss compare against (None when that component is off)."""

    kept: list[Scored]
    batch: Batch | None  # rows = ``kept`` in order; None when nothing is kept
    budget: int = 0  # the largest token budget of a kept sample (``max_tokens`` of the aggregation)
    ref_logprobs: torch.Tensor | None = None  # [B,T] the reference's (``algo.kl_coef`` > 0)
    teacher_logprobs: torch.Tensor | None = None  # [B,T] the teacher's (``distill.teacher``)
    values: torch.Tensor | None = None  # [B,T] the critic's, before its update (``algo.advantage: gae``)
    returns: torch.Tensor | None = None  # [B,T] the critic's targets, set with the advantages (gae)


def select_samples(scored: list[Scored], cfg: GRPOConfig) -> list[Scored]:
    """The samples a step trains on: all but those of zero-variance groups when
    ``algo.drop_zero_variance`` (every group estimator gives them advantage 0). With
    ``distill.mode: alone`` or a critic, every sample: the teacher's per-token signal and the
    critic's advantages need no group variance."""
    if cfg.distill.alone or not cfg.algo.drop_zero_variance or uses_critic(cfg):
        return list(scored)
    rewards = torch.tensor([s.reward for s in scored], dtype=torch.float32)
    groups = torch.tensor([s.trajectory.group_id for s in scored], dtype=torch.long)
    return [s for s, keep in zip(scored, group_has_variance(rewards, groups).tolist()) if keep]


def prepare(run: Run, kept: list[Scored], cfg: GRPOConfig) -> Prepared:
    """``kept`` collated once, and each step component's no-grad forwards on it at the weights
    that sampled it, before any optimizer step (``rlvr.train.components``). The reference's
    log-probs go into the loss's batch unless ``algo.kl_in_reward``. Data parallel: every rank
    prepares the whole batch."""
    if not kept:
        return Prepared(kept, None)
    device = next(run.model.parameters()).device
    batch = collate([s.trajectory for s in kept], [0.0] * len(kept), run.tokenizer.pad_token_id).to(device)
    budget = max(s.trajectory.token_budget(cfg.rollout.max_new_tokens) for s in kept)
    added: dict[str, torch.Tensor] = {}
    for part in run.components.values():
        added.update(part.prepare(batch))
    if not cfg.algo.kl_in_reward and "ref_logprobs" in added:
        batch = dataclasses.replace(batch, ref_logprobs=added["ref_logprobs"])  # the KL term of the loss
    return Prepared(kept, batch, budget, **added)


def compute_advantages(p: Prepared, cfg: GRPOConfig) -> tuple[Prepared, dict]:
    """``p`` with its batch's advantages: the estimator (``ADVANTAGES``) over the kept samples'
    rewards, less the KL penalty with ``algo.kl_in_reward``; with distillation ([B,T]) the
    teacher's per-token signal added to them (``distill.mode: add``) or alone. And the step's
    advantage metrics."""
    if not p.kept:
        return p, {}
    a, b, metrics = cfg.algo, p.batch, {}
    rewards = torch.tensor([s.reward for s in p.kept], dtype=torch.float32)
    if a.advantage in NEEDS_VALUES:
        return value_advantages(p, rewards, cfg)
    if cfg.distill.alone:  # the teacher's signal is the only one
        return distill_advantages(p, torch.zeros_like(b.old_logprobs), cfg)
    if a.kl_in_reward:  # r_i - beta * sum_t kl_{i,t}, before the estimator
        penalty = kl_reward_penalty(b.old_logprobs, p.ref_logprobs, b.loss_mask, a.kl_estimator, a.kl_coef)
        rewards = rewards - penalty.to(rewards)
        metrics["rollout/kl_penalty_mean"] = float(penalty.mean())
    groups = torch.tensor([s.trajectory.group_id for s in p.kept], dtype=torch.long)
    advantages = ADVANTAGES.get(a.advantage)(rewards, groups).to(b.input_ids.device)
    if p.teacher_logprobs is not None:
        p, distill = distill_advantages(p, advantages[:, None], cfg)
        return p, {**metrics, **distill}
    return with_advantages(p, advantages), metrics


def with_advantages(p: Prepared, advantages: torch.Tensor, returns: torch.Tensor | None = None) -> Prepared:
    """``p`` whose batch carries ``advantages`` ([B] or [B,T]) and, with a critic, its ``returns``."""
    return dataclasses.replace(p, batch=dataclasses.replace(p.batch, advantages=advantages), returns=returns)


def distill_advantages(p: Prepared, base: torch.Tensor, cfg: GRPOConfig) -> tuple[Prepared, dict]:
    """``p`` with advantages [B,T] = ``base`` + the teacher's per-token reverse-KL signal
    (``rlvr.algos.distill``), and the step's ``distill/reverse_kl``."""
    b = p.batch
    advantages = base + reverse_kl_advantages(b.old_logprobs, p.teacher_logprobs, b.loss_mask, cfg.distill.coef)
    return with_advantages(p, advantages), {"distill/reverse_kl": reverse_kl(b.old_logprobs, p.teacher_logprobs,
                                                                             b.loss_mask)}


def value_advantages(p: Prepared, rewards: torch.Tensor, cfg: GRPOConfig) -> tuple[Prepared, dict]:
    """An estimator over the critic's values (``algo.advantage: gae``): token advantages [B,T]
    from each sample's outcome reward at its last policy token, and the critic's targets (GAE's
    returns, never whitened). With ``algo.kl_in_reward``, -kl_coef * kl_t at every policy token
    (sampling log-probs against the reference's), as InstructGPT and OpenRLHF."""
    a, b, c = cfg.algo, p.batch, cfg.critic
    kl = masked_kl(b.old_logprobs, p.ref_logprobs, b.loss_mask, a.kl_estimator) if a.kl_in_reward else None
    rewards = rewards.to(b.input_ids.device)
    advantages, returns = ADVANTAGES.get(a.advantage)(rewards, None, values=p.values, mask=b.loss_mask, gamma=c.gamma,
                                                      lam=c.lam, whiten_advantages=c.whiten_advantages, kl=kl,
                                                      beta=a.kl_coef)
    metrics = {} if kl is None else {"rollout/kl_penalty_mean": float(a.kl_coef * kl.sum(-1).mean())}
    return with_advantages(p, advantages, returns), metrics
