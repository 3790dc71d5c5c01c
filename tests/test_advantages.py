"""Advantage estimators and the zero-variance mask against plain Python loops."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algos import ADVANTAGES, group_has_variance
from rlvr.algos.advantages import NEEDS_VALUES

GROUP_ESTIMATORS = [n for n in ADVANTAGES.names() if n not in NEEDS_VALUES]  # gae: tests/test_gae.py
from rlvr.algos.advantages import WITHOUT_GROUP_BASELINE
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


def ref_batch_whiten(a: list[float], eps: float) -> list[float]:
    """a / (sample std of a + eps); 0 when the std is 0 (a is already centred)."""
    n = len(a)
    mean = sum(a) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in a) / max(n - 1, 1))
    return [v / (std + eps) if std > 0 else 0.0 for v in a]


def ref_reinforce_pp(r: list[float], g: torch.Tensor, eps: float) -> list[float]:
    mean = sum(r) / len(r)
    return ref_batch_whiten([v - mean for v in r], eps)


def ref_reinforce_pp_baseline(r: list[float], g: torch.Tensor, eps: float) -> list[float]:
    centred = []
    for i in range(len(r)):
        vals = [r[j] for j in members(g, i)]
        centred.append(r[i] - sum(vals) / len(vals) if len(set(vals)) > 1 else 0.0)
    mean = sum(centred) / len(centred)  # 0 up to rounding: REINFORCE++-baseline subtracts it
    return ref_batch_whiten([v - mean for v in centred], eps)


REFERENCES = {"grpo": ref_grpo, "dr_grpo": ref_dr_grpo, "rloo": ref_rloo, "reinforce_pp": ref_reinforce_pp,
              "reinforce_pp_baseline": ref_reinforce_pp_baseline}


def test_every_estimator_has_a_reference():
    assert set(GROUP_ESTIMATORS) == set(REFERENCES)


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
    for name in GROUP_ESTIMATORS:
        if name in WITHOUT_GROUP_BASELINE:
            continue
        adv = ADVANTAGES.get(name)(rewards, group_ids)
        assert torch.equal(adv, torch.zeros(4)), name


def test_rloo_is_scaled_dr_grpo():
    rewards, group_ids = random_groups(3)
    n = torch.tensor([len(members(group_ids, i)) for i in range(len(rewards))], dtype=torch.float64)
    scaled = ADVANTAGES.get("dr_grpo")(rewards, group_ids) * n / (n - 1).clamp(min=1)
    torch.testing.assert_close(ADVANTAGES.get("rloo")(rewards, group_ids), torch.where(n > 1, scaled, 0.0))


def test_reinforce_pp_ignores_groups_and_keeps_singletons():
    """No group baseline: a singleton and a constant group get (r - batch mean) / batch std."""
    rewards = torch.tensor([3.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    adv = ADVANTAGES.get("reinforce_pp")(rewards, torch.tensor([5, 9, 9, 9]), eps=0.0)
    std = math.sqrt((1.5**2 + 3 * 0.5**2) / 3)  # sample std (divisor N - 1) of the batch
    torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64) / std)
    other_ids = ADVANTAGES.get("reinforce_pp")(rewards, torch.tensor([1, 2, 3, 4]), eps=0.0)
    assert torch.equal(other_ids, adv)


def test_reinforce_pp_baseline_is_dr_grpo_over_the_batch_std():
    """Group baselines make the batch mean 0, so the batch whitening is a division by the
    sample std; singletons and constant groups get exactly 0 and still count in that std."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 7.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    group_ids = torch.tensor([1, 1, 1, 4, 6, 6, 6])  # group 4: one sample; group 6: constant
    centred = ADVANTAGES.get("dr_grpo")(rewards, group_ids)
    want = centred / centred.std()  # torch.std: divisor N - 1 = 6, over all 7 samples
    got = ADVANTAGES.get("reinforce_pp_baseline")(rewards, group_ids, eps=0.0)
    torch.testing.assert_close(got, want)
    assert torch.equal(got[3:], torch.zeros(4))
    assert math.isclose(float(got.std()), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_batch_normalised_degenerate_batches_give_zero_not_nan(name, eps):
    fn = ADVANTAGES.get(name)
    for dtype in (torch.float32, torch.float64):
        # all-equal rewards (0.1 is not exact in binary: the mean may round off by an ulp)
        assert torch.equal(fn(torch.full((9,), 0.1, dtype=dtype), torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2]), eps=eps),
                           torch.zeros(9, dtype=dtype))
        assert torch.equal(fn(torch.tensor([4.0], dtype=dtype), torch.tensor([3]), eps=eps), torch.zeros(1, dtype=dtype))
        assert fn(torch.zeros(0, dtype=dtype), torch.zeros(0, dtype=torch.long), eps=eps).shape == (0,)
    # every group constant but the groups differ: REINFORCE++ ranks them, the baseline zeroes them
    adv = fn(torch.tensor([0.1, 0.1, 0.7, 0.7]), torch.tensor([0, 0, 1, 1]), eps=eps)
    assert torch.isfinite(adv).all()
    assert (adv[2] > 0 > adv[0]) if name == "reinforce_pp" else torch.equal(adv, torch.zeros(4))


def test_batch_normalised_statistics_count_every_sample_passed_in():
    """Constant groups passed in count in the batch statistics (the trainer decides what it
    passes): adding them changes the other samples' advantages."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    group_ids = torch.tensor([0, 0, 0, 0])
    padded_r = torch.cat([rewards, torch.ones(4, dtype=torch.float64)])
    padded_g = torch.cat([group_ids, torch.tensor([1, 1, 2, 2])])
    for name in ("reinforce_pp", "reinforce_pp_baseline"):
        alone = ADVANTAGES.get(name)(rewards, group_ids, eps=0.0)
        padded = ADVANTAGES.get(name)(padded_r, padded_g, eps=0.0)
        torch.testing.assert_close(padded, torch.tensor(REFERENCES[name](padded_r.tolist(), padded_g, 0.0),
                                                        dtype=torch.float64))
        assert not torch.allclose(padded[:4], alone), name


def test_shape_mismatch_raises():
    for name in GROUP_ESTIMATORS:
        with pytest.raises(ValueError, match="same length"):
            ADVANTAGES.get(name)(torch.zeros(3), torch.zeros(4, dtype=torch.long))


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
    with pytest.raises(UserError, match="dr_grpo, gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo"):
        ADVANTAGES.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGES.register("grpo")(lambda r, g, *, eps=1e-6: r)
    # Re-registering the same object is idempotent (module re-import), not a conflict.
    ADVANTAGES.register("grpo")(ADVANTAGES.get("grpo"))
    fresh = Registry("thing")
    with pytest.raises(ValueError, match="lowercase"):
        fresh.register("Grpo")
