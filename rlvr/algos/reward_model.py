"""Reward-model losses: pure functions of the scalar rewards of (chosen, rejected) pairs.

    bradley_terry   -log sigmoid(r_chosen - r_rejected - margin), mean over pairs, plus
                    center_coef * mean((r_chosen + r_rejected)^2) (reward centering, Eisenstein
                    et al. 2023): TRL's ``RewardTrainer.compute_loss`` term for term
                    (``benchmarks/rm_vs_trl.py`` checks it against TRL to 1e-5)
    step_bce        process rewards: binary cross-entropy of each step's logit against its label
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def bradley_terry(chosen: Tensor, rejected: Tensor, margin: Tensor | None = None,
                  center_coef: float = 0.0) -> Tensor:
    """The mean Bradley-Terry loss of ``chosen`` [N] over ``rejected`` [N] rewards; ``margin`` [N]
    (optional) is how far chosen should beat rejected; ``center_coef`` > 0 pulls rewards to 0."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * torch.mean((chosen + rejected) ** 2)
    return loss


def pairwise_metrics(chosen: Tensor, rejected: Tensor) -> dict[str, float]:
    """Accuracy (chosen scored above rejected; a tie counts as wrong), mean margin and the reward
    distribution of a batch of pairs."""
    both = torch.cat([chosen, rejected]).detach().float()
    return {"accuracy": (chosen > rejected).float().mean().item(),
            "margin": (chosen - rejected).mean().item(),
            "reward_mean": both.mean().item(), "reward_std": both.std(unbiased=False).item(),
            "reward_min": both.min().item(), "reward_max": both.max().item(),
            "chosen_mean": chosen.mean().item(), "rejected_mean": rejected.mean().item()}


def step_bce(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean binary cross-entropy of step logits [S] against 0/1 step labels [S]."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
