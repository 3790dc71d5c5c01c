"""Advantage estimators and the zero-variance mask against plain Python loops."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algos import ADVANTAGES, group_has_variance
from rlvr.errors import UserError
from rlvr.registry import Registry


def random_groups(seed: int, binary: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random group sizes (1..6), arbitrary non-contiguous ids, shuffled order."""
    rng = random.Random(seed)
    ids, rewards = [], []
    for _ in range(rng.randint(1, 7)):
        gid = rng.randint(-1000, 10**9)
        for _ in range(rng.randint(1, 6)):
            ids.append(gid)
            rewards.append(float(rng.randint(0, 1)) if binary else rng.uniform(-2, 2))
    order = list(range(len(ids)))
    rng.shuffle(order)
    return (
        torch.tensor([rewards[i] for i in order], dtype=torch.float64),
        torch.tensor([ids[i] for i in order], dtype=torch.long),
    )


def members(group_ids: torch.Tensor, i: int) -> list[int]:
    return [j for j in range(len(group_ids)) if group_ids[j] == group_ids[i]]


def ref_grpo(r: list[float], g: torch.Tensor, eps: float) -> list[float]:
    out = []
    for i in range(len(r)):
        vals = [r[j] for j in members(g, i)]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        out.append((r[i] - mean) / (std + eps))
    return out


def ref_dr_grpo(r: list[float], g: torch.Tensor, eps: float) -> list[float]:
    out = []
    for i in range(len(r)):
        vals = [r[j] for j in members(g, i)]
        out.append(r[i] - sum(vals) / len(vals))
    return out


def ref_rloo(r: list[float], g: torch.Tensor, eps: float) -> list[float]:
    out = []
    for i in range(len(r)):
        others = [r[j] for j in members(g, i) if j != i]
        out.append(r[i] - sum(others) / len(others) if others else 0.0)
    return out


REFERENCES = {"grpo": ref_grpo, "dr_grpo": ref_dr_grpo, "rloo": ref_rloo}


def test_every_estimator_has_a_reference():
    assert set(ADVANTAGES.names()) == set(REFERENCES)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("binary", [False, True])
def test_estimator_matches_loop(name, seed, binary):
    rewards, group_ids = random_groups(seed, binary)
    got = ADVANTAGES.get(name)(rewards, group_ids, eps=1e-6)
    want = REFERENCES[name](rewards.tolist(), group_ids, 1e-6)
    assert got.shape == rewards.shape and got.dtype == rewards.dtype
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_grpo_uses_sample_std():
    # Group [0, 1]: mean 0.5, sample std sqrt(0.5) (population std would be 0.5).
    adv = ADVANTAGES.get("grpo")(torch.tensor([0.0, 1.0]), torch.tensor([7, 7]), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5]) / math.sqrt(0.5))


def test_singletons_and_constant_groups_get_zero():
    rewards = torch.tensor([3.0, 1.0, 1.0, 1.0])
    group_ids = torch.tensor([5, 9, 9, 9])
    for name in ADVANTAGES:
        adv = ADVANTAGES.get(name)(rewards, group_ids)
        assert torch.equal(adv, torch.zeros(4)), name


def test_rloo_is_scaled_dr_grpo():
    rewards, group_ids = random_groups(3)
    n = torch.tensor([len(members(group_ids, i)) for i in range(len(rewards))], dtype=torch.float64)
    scaled = ADVANTAGES.get("dr_grpo")(rewards, group_ids) * n / (n - 1).clamp(min=1)
    torch.testing.assert_close(ADVANTAGES.get("rloo")(rewards, group_ids), torch.where(n > 1, scaled, 0.0))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same length"):
        ADVANTAGES.get("grpo")(torch.zeros(3), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("seed", range(6))
def test_group_has_variance_matches_loop(seed):
    rewards, group_ids = random_groups(seed, binary=True)
    want = [len({float(rewards[j]) for j in members(group_ids, i)}) > 1 for i in range(len(rewards))]
    assert group_has_variance(rewards, group_ids).tolist() == want


def test_group_has_variance_examples():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5])
    group_ids = torch.tensor([2, 2, 8, 8, 4])
    assert group_has_variance(rewards, group_ids).tolist() == [True, True, False, False, False]


def test_registry_unknown_lists_choices_and_duplicate_raises():
    with pytest.raises(UserError, match="dr_grpo, grpo, rloo"):
        ADVANTAGES.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGES.register("grpo")(lambda r, g, *, eps=1e-6: r)
    # Re-registering the same object is idempotent (module re-import), not a conflict.
    ADVANTAGES.register("grpo")(ADVANTAGES.get("grpo"))
    fresh = Registry("thing")
    with pytest.raises(ValueError, match="lowercase"):
        fresh.register("Grpo")
