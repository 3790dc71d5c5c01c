"""Per-token estimators of KL(pi || pi_ref) from sampled tokens' log-probs.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). With
tokens sampled from pi and log_r = logpi_ref - logpi:
- ``k1`` = -log_r = logpi - logpi_ref: unbiased, high variance, can be negative per token.
- ``k2`` = 0.5 * log_r^2: biased, low variance, >= 0.
- ``k3`` = exp(log_r) - log_r - 1: unbiased, low variance, >= 0 (GRPO, DeepSeekMath Eq. 4).

One signature, registered in ``KL_ESTIMATORS``: ``fn(logprobs, ref_logprobs) -> Tensor`` of the
same shape (elementwise; usually [B,T]). This module neither masks nor aggregates: the trainer
reduces with the loss aggregation over ``loss_mask`` and scales by beta (default 0, i.e. off).
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
