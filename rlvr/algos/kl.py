"""Per-token estimators of KL(pi || pi_ref) from sampled tokens' log-probs.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). With
tokens sampled from pi and log_r = logpi_ref - logpi:
- ``k1`` = -log_r = logpi - logpi_ref: unbiased, high variance, can be negative per token.
- ``k2`` = 0.5 * log_r^2: biased, low variance, >= 0.
- ``k3`` = exp(log_r) - log_r - 1: unbiased, low variance, >= 0 (GRPO, DeepSeekMath Eq. 4).

One signature, registered in ``KL_ESTIMATORS``: ``fn(logprobs, ref_logprobs) -> Tensor`` of the
same shape (elementwise; usually [B,T]). The estimators neither mask nor aggregate: with the KL in
the loss the trainer reduces with the loss aggregation over ``loss_mask`` and scales by beta
(default 0, i.e. off); with the KL in the reward (``algo.kl_in_reward``) ``masked_kl`` and
``kl_reward_penalty`` give the per-token values and the per-sequence penalty.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlvr.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("kl estimator")


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = logpi - logpi_ref (Schulman 2020). Any shape -> same shape."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = 0.5 * (logpi - logpi_ref)^2 (Schulman 2020). Any shape -> same shape."""
    return 0.5 * (logprobs - ref_logprobs).square()


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(logpi_ref - logpi) - (logpi_ref - logpi) - 1 (Schulman 2020; DeepSeekMath Eq. 4).

    Exact formula, no clamping: it overflows only when logpi_ref - logpi > ~88 (fp32).
    Any shape -> same shape, >= 0.
    """
    log_r = ref_logprobs - logprobs
    return log_r.exp() - log_r - 1


def logprob_mismatch_kl(trainer_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> float:
    """``rollout/logprob_mismatch_kl``: how far the rollout engine's sampling log-probs are from the
    trainer's log-probs of the same tokens at the same weights (float error, kernels, precision;
    a large value means the IS ratio pi_trainer / pi_engine is not ~1 even on-policy).

    k3 estimate of KL(pi_engine || pi_trainer) over the engine's samples (tokens drawn from the
    engine): mean over ``mask == 1`` of exp(d) - d - 1 with d = trainer - behaviour; >= 0, and
    0 exactly when the two agree. 0.0 when the mask is empty.

    trainer_logprobs [B,T], behaviour_logprobs [B,T], mask [B,T] -> float.
    """
    m = mask.to(trainer_logprobs.dtype)
    kl = k3(behaviour_logprobs.detach().to(trainer_logprobs.dtype), trainer_logprobs.detach())
    kl = torch.where(m > 0, kl, torch.zeros_like(kl))  # off-mask values may be anything (inf, stale)
    return float(kl.sum() / m.sum().clamp(min=1))


def masked_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate ``KL_ESTIMATORS[estimator](logprobs, ref_logprobs)`` on ``mask == 1``,
    exactly 0 elsewhere (off-mask values may be anything, inf and nan included; they never leak).

    logprobs [B,T], ref_logprobs [B,T], mask [B,T] -> [B,T] (logprobs' dtype), no gradient.
    """
    on = mask > 0
    zero = torch.zeros_like(logprobs)
    lp = torch.where(on, logprobs.detach(), zero)
    ref = torch.where(on, ref_logprobs.detach().to(logprobs.dtype), zero)
    return torch.where(on, KL_ESTIMATORS.get(estimator)(lp, ref), zero)


def kl_reward_penalty(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str, beta: float) -> Tensor:
    """KL in the reward, sequence level: beta * sum_t kl_t over each sequence's policy tokens.

    The trainer subtracts it from each sample's reward before the advantage estimator (r_i - beta *
    sum_t kl_{i,t}; the sequence-level form of Ziegler et al. 2019, "Fine-Tuning Language Models
    from Human Preferences", Eq. 2, and of verl's ``use_kl_in_reward``), with ``logprobs`` the
    sampling log-probs and ``kl_t`` the ``estimator`` of ``masked_kl``; the loss then has no KL term.

    logprobs [B,T], ref_logprobs [B,T], mask [B,T] -> penalties [B] (>= 0 for k2/k3), no gradient.
    """
    return beta * masked_kl(logprobs, ref_logprobs, mask, estimator).sum(dim=-1)
