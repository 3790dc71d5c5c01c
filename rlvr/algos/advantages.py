"""Group-relative advantage estimators: one scalar advantage per sample from its group's rewards.

A group is the G samples drawn for one task; ``group_ids[i]`` names the group of sample ``i``.
Ids are arbitrary integers: groups need not be contiguous, sorted or of equal size. Every
estimator is vectorised over groups (``torch.unique`` + ``index_add_``) and registered in
``ADVANTAGES`` with one signature::

    fn(rewards: Tensor[N] float, group_ids: Tensor[N] long, *, eps: float = 1e-6) -> Tensor[N]

Estimators that do not use ``eps`` accept and ignore it, so callers never branch on the name.
A sample in a group of size 1 gets advantage 0 from every estimator (it has no baseline).

This module does not broadcast advantages to tokens, drop zero-variance groups or touch the
batch: ``group_has_variance`` returns the mask, and the trainer (``rlvr/train/grpo.py:
compute_advantages``) drops the samples of groups without variance when
``algo.drop_zero_variance`` is on. Nothing refills the batch: a step trains on the samples left.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlvr.registry import Registry

AdvantageFn = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _group_index(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, int]:
    """Map arbitrary group ids to 0..G-1. Returns (index [N], counts [G], G)."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length, got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    _, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return index, counts, int(counts.numel())


def _group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Sum of ``values`` [N] per group -> [G]."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def _group_mean(rewards: Tensor, index: Tensor, counts: Tensor, num_groups: int) -> Tensor:
    """Mean reward of each sample's group, gathered back to samples -> [N]."""
    return (_group_sum(rewards, index, num_groups) / counts.to(rewards.dtype))[index]


@ADVANTAGES.register("grpo")
def grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean_g r) / (std_g r + eps).

    Shao et al. 2024, "DeepSeekMath", Sec. 4.1.2 (outcome supervision). ``std`` is the *sample*
    standard deviation (Bessel-corrected, divisor G - 1), as in ``torch.std`` and the TRL and verl
    implementations. A group of size 1 has no defined std; its advantage is 0 (r - mean = 0).

    rewards [N] float, group_ids [N] long -> advantages [N] (dtype of rewards).
    """
    index, counts, num_groups = _group_index(rewards, group_ids)
    centred = rewards - _group_mean(rewards, index, counts, num_groups)
    # Two-pass variance (centre first) is stable where E[r^2] - E[r]^2 is not.
    sq_sum = _group_sum(centred * centred, index, num_groups)
    dof = (counts - 1).clamp(min=1).to(rewards.dtype)
    std = (sq_sum / dof).sqrt()[index]
    return centred / (std + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean_g r (no std normalisation; ``eps`` unused).

    Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", Sec. 3.1:
    dividing by the group std up-weights groups that are nearly all-right or all-wrong.

    rewards [N] float, group_ids [N] long -> advantages [N].
    """
    index, counts, num_groups = _group_index(rewards, group_ids)
    return rewards - _group_mean(rewards, index, counts, num_groups)


@ADVANTAGES.register("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean_{j != i, j in g} r_j (``eps`` unused).

    Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al. 2024,
    "Back to Basics" (RLOO). Computed as r_i - (S_g - r_i) / (G - 1) with S_g the group sum.
    A group of size 1 has no other sample to form a baseline: its advantage is 0.

    rewards [N] float, group_ids [N] long -> advantages [N].
    """
    index, counts, num_groups = _group_index(rewards, group_ids)
    group_sum = _group_sum(rewards, index, num_groups)[index]
    n = counts[index].to(rewards.dtype)
    baseline = (group_sum - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - baseline, torch.zeros_like(rewards))


def group_has_variance(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """True for samples whose group's rewards are not all equal (DAPO "dynamic sampling").

    Yu et al. 2025, "DAPO", Sec. 3.2: a group whose rewards are all equal has zero advantage for
    every sample under any group-relative estimator, so it carries no gradient signal. Compared
    exactly (max != min), not by a variance threshold. Groups of size 1 are False.

    rewards [N] float, group_ids [N] long -> mask [N] bool.
    """
    index, _, num_groups = _group_index(rewards, group_ids)
    init = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    high = init.scatter_reduce(0, index, rewards, reduce="amax", include_self=False)
    low = init.scatter_reduce(0, index, rewards, reduce="amin", include_self=False)
    return (high != low)[index]
