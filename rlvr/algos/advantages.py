"""Advantage estimators: one scalar advantage per sample from its group's (or the batch's) rewards.

A group is the G samples drawn for one task; ``group_ids[i]`` names the group of sample ``i``.
Ids are arbitrary integers: groups need not be contiguous, sorted or of equal size. Every
estimator is vectorised over groups (``torch.unique`` + ``index_add_``) and registered in
``ADVANTAGES`` with one signature::

    fn(rewards: Tensor[N] float, group_ids: Tensor[N] long, *, eps: float = 1e-6) -> Tensor[N]

Estimators that do not use ``eps`` accept and ignore it, so callers never branch on the name.
An estimator that needs a learned critic's values declares it in ``NEEDS_VALUES`` (``gae``,
registered by ``rlvr.algos.gae``), takes them as keywords instead of group ids, and returns the
critic's targets with the token advantages.
A sample in a group of size 1 gets advantage 0 from every estimator with a group baseline (it
has no baseline); ``reinforce_pp`` has none (``WITHOUT_GROUP_BASELINE``). The estimators in
``BATCH_NORMALISED`` use statistics of the whole batch they are given, so a sample's advantage
also depends on the other groups' rewards.

This module does not broadcast advantages to tokens, drop zero-variance groups or touch the
batch: ``group_has_variance`` returns the mask, and the trainer (``rlvr/train/grpo.py:
select_samples``) drops the samples of groups without variance when ``algo.drop_zero_variance``
is on. Refilling the batch (dynamic sampling: ``algo.dynamic_sampling_rounds``, or the
curriculum's ``filter.refill_rounds``) is the rollout source's (``rlvr.rollout.sync_rollout``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlvr.registry import Registry

AdvantageFn = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")

BATCH_NORMALISED: frozenset[str] = frozenset({"reinforce_pp", "reinforce_pp_baseline"})
"""Estimators normalised over the whole batch: groups are not independent under them."""
WITHOUT_GROUP_BASELINE: frozenset[str] = frozenset({"reinforce_pp"})
"""Estimators with no per-group baseline: singletons and constant groups get non-zero advantages."""
NEEDS_VALUES: frozenset[str] = frozenset({"gae"})
"""Estimators over a learned critic's values (``rlvr.algos.gae``): called as ``fn(rewards, None, *,
values, mask, gamma, lam, whiten_advantages, kl, beta)`` and returning (token advantages [N, T],
the critic's regression targets [N, T])."""


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


def _batch_whiten(centred: Tensor, eps: float) -> Tensor:
    """centred / (std_batch + eps), std the sample std (divisor N - 1) of ``centred`` about its
    batch mean; 0 where the std is 0 (an all-equal batch, or N = 1), never nan (even at eps 0).
    Returns float64: callers cast back to the rewards' dtype."""
    n = centred.numel()
    if n == 0:
        return centred.clone()
    c = centred.double()  # batch sums in float64: the result does not depend on the sample order
    dev = c - c.mean()
    std = ((dev * dev).sum() / max(n - 1, 1)).sqrt()
    return torch.where(std > 0, c / (std + eps), torch.zeros_like(c))


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: A_i = (r_i - mean_batch r) / (std_batch r + eps), no per-group baseline.

    Hu 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and Reward
    Models" (arXiv 2501.03262), global advantage normalisation: A_norm = (A - mu_batch) /
    sigma_batch over the whole batch, with A the (gamma = 1) return of the outcome reward. The
    paper's return also carries a token-level KL penalty, -beta * sum_t KL_t; rlvr applies it at
    sequence level with ``algo.kl_in_reward`` (the trainer subtracts beta * sum_t kl_t from r
    before calling the estimator). Statistics are over the samples (each sequence once; verl and
    OpenRLHF whiten over tokens, weighting long sequences more) with the sample std (divisor
    N - 1, as verl's ``masked_whiten``). They are over every sample passed in: the trainer
    (``rlvr/train/grpo.py: compute_advantages``) passes the samples it keeps, so with
    ``algo.drop_zero_variance`` the groups of equal rewards (which under this estimator do carry a
    signal) are gone before this call; verl whitens over the whole rollout batch.
    ``group_ids`` only checks the shapes. An all-equal batch gives 0 everywhere (not nan).

    rewards [N] float, group_ids [N] long -> advantages [N] (dtype of rewards).
    """
    _group_index(rewards, group_ids)
    if rewards.numel() and bool(rewards.max() == rewards.min()):
        return torch.zeros_like(rewards)
    return _batch_whiten(rewards.double() - rewards.double().mean(), eps).to(rewards.dtype)


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline: A_i = r_i - mean_g r, then A_i / (std_batch A + eps).

    Hu 2025 (arXiv 2501.03262), REINFORCE++-baseline for groups of samples per prompt: the group
    mean reward is the baseline, A'_i = r_i - mean_g r, then normalised over the global batch,
    A_i = (A'_i - mean_batch A') / (std_batch A' + eps) (verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``, OpenRLHF ``reinforce_baseline``).
    Each group's A' sums to 0, so over samples mean_batch A' = 0 exactly and the normalisation
    is a division by the batch std; verl and OpenRLHF whiten over *tokens*, where the mean is a
    length-weighted one and not 0: rlvr's estimators are sequence-level and weigh each sample
    once. std: the sample std (divisor N - 1) about the batch mean, as verl's ``masked_whiten``.
    A group of size 1 has no baseline (verl uses a baseline of 0 there, A' = r): its advantage
    is 0 here, as under every group-relative estimator; a constant group also gets exactly 0.
    Statistics are over every sample passed in (the trainer passes the samples it keeps: with
    ``algo.drop_zero_variance`` constant groups, whose zeros would shrink the std, are already
    gone; verl whitens over the whole rollout batch). An all-equal batch gives 0 (not nan).

    rewards [N] float, group_ids [N] long -> advantages [N] (dtype of rewards).
    """
    index, counts, num_groups = _group_index(rewards, group_ids)
    centred = rewards - _group_mean(rewards, index, counts, num_groups)
    # Exact zeros for constant groups (their mean can round off r by an ulp, which the batch
    # std would blow up when every group is constant).
    centred = torch.where(group_has_variance(rewards, group_ids), centred, torch.zeros_like(centred))
    return _batch_whiten(centred, eps).to(rewards.dtype)


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
