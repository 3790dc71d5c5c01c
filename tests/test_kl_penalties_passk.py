"""KL estimators, overlong penalty, truncated IS weights and pass@k against formulas and loops."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from rlvr.algos import (
    KL_ESTIMATORS,
    confidence_interval,
    mean_pass_at_k,
    overlong_penalty,
    pass_at_k,
    truncated_is_weights,
    wilson_interval,
)
from rlvr.errors import UserError

# --------------------------------------------------------------------------- KL

KL_REFERENCES = {
    "k1": lambda lp, ref: lp - ref,
    "k2": lambda lp, ref: 0.5 * (lp - ref) ** 2,
    "k3": lambda lp, ref: math.exp(ref - lp) - (ref - lp) - 1,
}


def test_every_kl_estimator_has_a_reference():
    assert set(KL_ESTIMATORS.names()) == set(KL_REFERENCES)


@pytest.mark.parametrize("name", sorted(KL_REFERENCES))
def test_kl_matches_formula(name):
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 5
    ref = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 5
    got = KL_ESTIMATORS.get(name)(lp, ref)
    assert got.shape == lp.shape
    want = [[KL_REFERENCES[name](a, b) for a, b in zip(ra, rb)] for ra, rb in zip(lp.tolist(), ref.tolist())]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_k3_nonnegative_and_zero_on_equal():
    gen = torch.Generator().manual_seed(1)
    lp = torch.randn(1000, generator=gen) * 4
    ref = torch.randn(1000, generator=gen) * 4
    assert torch.all(KL_ESTIMATORS.get("k3")(lp, ref) >= 0)
    assert torch.all(KL_ESTIMATORS.get("k3")(lp, lp) == 0)


def test_k1_and_k3_estimate_true_kl():
    """Sampling y ~ pi: mean k1 and mean k3 both approach KL(pi || pi_ref) (both unbiased)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    y = torch.multinomial(p, 20000, replacement=True, generator=torch.Generator().manual_seed(0))
    for name in ("k1", "k3"):
        est = float(KL_ESTIMATORS.get(name)(p.log()[y], q.log()[y]).mean())
        assert abs(est - true_kl) < 0.02, name


@pytest.mark.parametrize("name", sorted(KL_REFERENCES))
def test_kl_reward_penalty_matches_a_loop_and_ignores_off_mask_garbage(name):
    from rlvr.algos.kl import kl_reward_penalty, masked_kl

    gen = torch.Generator().manual_seed(1)
    lp = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 4
    ref = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 4
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 1, 1, 0], [0] * 7, [1] * 7], dtype=torch.float64)
    lp[mask == 0] = float("nan")  # off the mask: anything, never leaks
    ref[(mask == 0) & (torch.arange(7) % 2 == 0)] = float("inf")
    beta = 0.3
    expected = [beta * sum(KL_REFERENCES[name](float(lp[i, t]), float(ref[i, t])) for t in range(7) if mask[i, t])
                for i in range(4)]
    got = kl_reward_penalty(lp, ref, mask, name, beta)
    assert got.shape == (4,) and torch.isfinite(got).all()
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert got[2] == 0.0  # an empty mask: no penalty
    per_token = masked_kl(lp, ref, mask, name)
    assert (per_token[mask == 0] == 0).all() and per_token.sum(-1).mul(beta).allclose(got)


def test_kl_unknown_lists_choices():
    with pytest.raises(UserError, match="k1, k2, k3"):
        KL_ESTIMATORS.get("k4")


# --------------------------------------------------------------------------- penalties


def ref_overlong(length: float, max_tokens: int, buffer: int, penalty: float) -> float:
    if length <= max_tokens - buffer:
        return 0.0
    if length <= max_tokens:
        return ((max_tokens - buffer) - length) / buffer * penalty
    return -penalty


def test_overlong_penalty_matches_formula():
    lengths = torch.arange(0, 30)
    got = overlong_penalty(lengths, max_tokens=20, buffer=8, penalty=0.5)
    assert got.shape == lengths.shape and got.dtype == torch.float32
    want = [ref_overlong(float(n), 20, 8, 0.5) for n in lengths]
    torch.testing.assert_close(got, torch.tensor(want))
    # Shape: flat at 0, linear ramp, -penalty at the limit and beyond; monotone non-increasing.
    assert float(got[12]) == 0.0 and float(got[16]) == -0.25 and float(got[20]) == -0.5
    assert torch.all(got[21:] == -0.5) and torch.all(got[1:] <= got[:-1])


def test_overlong_penalty_zero_buffer_is_a_step_and_bad_buffer_raises():
    got = overlong_penalty(torch.tensor([5.0, 10.0, 11.0]), max_tokens=10, buffer=0)
    assert got.tolist() == [0.0, 0.0, -1.0]
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), max_tokens=10, buffer=11)


def test_truncated_is_weights():
    old = torch.tensor([[-1.0, -2.0, 0.0, -0.1]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -1.0, 0.0, -50.0]])
    w = truncated_is_weights(old, behaviour, cap=2.0)
    want = [min(math.exp(a - b), 2.0) for a, b in zip(old[0].tolist(), behaviour[0].tolist())]
    torch.testing.assert_close(w, torch.tensor([want]))
    assert not w.requires_grad and float(w.max()) <= 2.0
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old, behaviour, cap=0.0)


# --------------------------------------------------------------------------- pass@k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (c correct) that contain a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert math.isclose(pass_at_k(n, c, k), brute_pass_at_k(n, c, k), abs_tol=1e-12), (n, c, k)


def test_pass_at_k_known_values_and_stability():
    for n, c in [(10, 3), (200, 17), (1, 1)]:
        assert math.isclose(pass_at_k(n, c, 1), c / n, rel_tol=1e-12)
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0
    # Large n: exact binomials via math.comb agree with the product form.
    n, c, k = 1000, 7, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert math.isclose(pass_at_k(n, c, k), exact, rel_tol=1e-12)
    for bad in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_mean_pass_at_k():
    counts = [(10, 3), (10, 0), (5, 5)]
    assert math.isclose(mean_pass_at_k(counts, 1), (0.3 + 0.0 + 1.0) / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_confidence_interval():
    values = [0.1, 0.5, 0.9, 0.7]
    mean = sum(values) / 4
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    lo, hi = confidence_interval(values)
    assert math.isclose(lo, mean - 1.96 * s / 2) and math.isclose(hi, mean + 1.96 * s / 2)
    assert confidence_interval([0.0, 0.0, 0.05])[0] == 0.0  # clipped at 0
    assert confidence_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    assert confidence_interval([0.4]) == (0.0, 1.0)
    with pytest.raises(ValueError):
        confidence_interval([])


def test_wilson_interval():
    # Known value: 8 of 10 at z=1.96 -> (0.4902, 0.9433) (Wilson 1927; standard tables).
    lo, hi = wilson_interval(8, 10)
    assert abs(lo - 0.4902) < 1e-4 and abs(hi - 0.9433) < 1e-4
    lo0, hi0 = wilson_interval(0, 20)
    assert lo0 == 0.0 and 0.0 < hi0 < 0.2
    lo1, hi1 = wilson_interval(20, 20)
    assert 0.8 < lo1 < 1.0 and math.isclose(hi1, 1.0)
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 100)
        s = rng.randint(0, n)
        lo, hi = wilson_interval(s, n)
        assert 0.0 <= lo <= s / n <= hi <= 1.0
    with pytest.raises(ValueError):
        wilson_interval(1, 0)
