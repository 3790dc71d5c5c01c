"""rlvr.algos.gae against plain Python loop references: GAE over ragged masks with gaps, outcome
token rewards with KL, the clipped value loss, whitening; off-mask garbage never leaks."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algos.gae import explained_variance, gae, outcome_token_rewards, value_loss, whiten


def _ragged_mask(rng: random.Random, b: int, t: int) -> torch.Tensor:
    """Rows with a prompt prefix, policy spans with gaps (environment tokens), padding; some empty."""
    mask = torch.zeros(b, t)
    for i in range(b):
        kind = rng.random()
        if kind < 0.1:
            continue  # no policy token at all
        start, end = rng.randrange(0, t), rng.randrange(0, t + 1)
        for j in range(start, max(end, start + 1)):
            if j < t and rng.random() < 0.7:
                mask[i, j] = 1.0
    return mask


def _loop_gae(r, v, m, gamma, lam):
    """Textbook GAE over the list of policy-token timesteps of each row (Schulman et al. 2016)."""
    b, t = r.shape
    adv, ret = torch.zeros(b, t, dtype=torch.float64), torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        steps = [j for j in range(t) if m[i, j] > 0]
        for k, j in enumerate(steps):
            total = 0.0
            for l_, jj in enumerate(steps[k:]):
                nxt = float(v[i, steps[k + l_ + 1]]) if k + l_ + 1 < len(steps) else 0.0
                delta = float(r[i, jj]) + gamma * nxt - float(v[i, jj])
                total += (gamma * lam) ** l_ * delta
            adv[i, j] = total
            ret[i, j] = total + float(v[i, j])
    return adv, ret


def _garbage(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with nan/inf/huge values written at off-mask positions."""
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])
    fill = junk[torch.arange(x.numel()) % 4].reshape(x.shape).to(x.dtype)
    return torch.where(mask > 0, x, fill)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_loop_on_ragged_masks_with_gaps(gamma, lam):
    rng = random.Random(int(gamma * 100 + lam * 10))
    torch.manual_seed(0)
    for _ in range(5):
        b, t = 7, 13
        m = _ragged_mask(rng, b, t)
        r, v = torch.randn(b, t, dtype=torch.float64), torch.randn(b, t, dtype=torch.float64)
        adv, ret = gae(_garbage(r, m), _garbage(v, m), m, gamma=gamma, lam=lam)
        ref_adv, ref_ret = _loop_gae(r, v, m, gamma, lam)
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
        torch.testing.assert_close(adv, ref_adv)
        torch.testing.assert_close(ret, ref_ret)
        assert (adv[m == 0] == 0).all() and (ret[m == 0] == 0).all()


def test_gamma_lam_one_is_return_to_go_minus_value():
    m = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [1, 0, 1, 1, 1, 0, 0.]])
    r = outcome_token_rewards(torch.tensor([2.0, -1.0]), m)
    v = torch.randn(2, 7)
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    # the only reward is at the last policy token: A_t = R - V_t, returns = R at every policy token
    torch.testing.assert_close(adv, torch.where(m > 0, torch.tensor([[2.0], [-1.0]]) - v, 0.0))
    torch.testing.assert_close(ret, torch.where(m > 0, torch.tensor([[2.0], [-1.0]]), 0.0))


def test_lam_zero_is_one_step_td_over_skipped_environment_tokens():
    m = torch.tensor([[1, 0, 0, 1, 1.]])  # tokens 1-2 are environment tokens: 0 -> 3 is one step
    r = torch.tensor([[0.5, 9.0, 9.0, 0.0, 1.0]])
    v = torch.tensor([[0.1, 7.0, 7.0, 0.3, 0.4]])
    adv, _ = gae(r, v, m, gamma=0.9, lam=0.0)
    expected = torch.tensor([[0.5 + 0.9 * 0.3 - 0.1, 0, 0, 0.0 + 0.9 * 0.4 - 0.3, 1.0 - 0.4]])
    torch.testing.assert_close(adv, expected)


def test_gae_empty_mask_and_single_token():
    adv, ret = gae(torch.randn(3, 4), torch.randn(3, 4), torch.zeros(3, 4), gamma=1.0, lam=0.95)
    assert (adv == 0).all() and (ret == 0).all()
    m = torch.tensor([[0, 0, 1.0, 0]])
    adv, ret = gae(torch.tensor([[0, 0, 3.0, 0]]), torch.tensor([[5, 5, 1.0, 5]]), m, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0, 0, 2.0, 0]]))  # terminal: r - V
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 3.0, 0]]))


def test_outcome_token_rewards_with_kl_matches_loop():
    rng = random.Random(3)
    m = _ragged_mask(rng, 9, 11)
    rewards = torch.randn(9)
    kl = torch.randn(9, 11)
    out = outcome_token_rewards(rewards, m, _garbage(kl, m), beta=0.1)
    ref = torch.zeros(9, 11)
    for i in range(9):
        steps = [j for j in range(11) if m[i, j] > 0]
        for j in steps:
            ref[i, j] = -0.1 * kl[i, j]
        if steps:
            ref[i, steps[-1]] += rewards[i]
    torch.testing.assert_close(out, ref)
    plain = outcome_token_rewards(rewards, m)
    assert torch.allclose(plain.sum(1), torch.where(m.sum(1) > 0, rewards, 0.0))
    assert (plain[m == 0] == 0).all()


def _loop_value_loss(v, old, ret, m, clip):
    total, n, clipped = 0.0, 0, 0
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            if m[i, j] > 0:
                a = (float(v[i, j]) - float(ret[i, j])) ** 2
                vc = float(old[i, j]) + min(max(float(v[i, j]) - float(old[i, j]), -clip), clip)
                b = (vc - float(ret[i, j])) ** 2
                total += 0.5 * max(a, b)
                clipped += b > a
                n += 1
    return total / max(n, 1), clipped / max(n, 1)


def test_value_loss_matches_loop_and_off_mask_garbage_does_not_leak():
    rng = random.Random(5)
    torch.manual_seed(5)
    m = _ragged_mask(rng, 6, 10)
    m[0, 3] = 1.0
    v, old, ret = torch.randn(6, 10), torch.randn(6, 10), torch.randn(6, 10)
    leaf = _garbage(v, m).requires_grad_(True)
    loss, metrics = value_loss(leaf, _garbage(old, m), _garbage(ret, m), m, clip=0.2)
    ref, ref_frac = _loop_value_loss(v, old, ret, m, 0.2)
    assert math.isclose(float(loss.detach()), ref, rel_tol=1e-5)
    assert math.isclose(metrics["value_clip_frac"], ref_frac, rel_tol=1e-6)
    assert 0 < metrics["value_clip_frac"] < 1
    loss.backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[m == 0] == 0).all()


def test_value_loss_microbatches_sum_to_the_full_loss_and_no_clip():
    torch.manual_seed(1)
    m = (torch.rand(8, 6) > 0.3).float()
    v, old, ret = torch.randn(8, 6), torch.randn(8, 6), torch.randn(8, 6)
    full, _ = value_loss(v, old, ret, m, clip=0.2)
    n = float(m.sum())
    parts = sum(float(value_loss(v[s], old[s], ret[s], m[s], clip=0.2, num_tokens=n)[0])
                for s in (slice(0, 3), slice(3, 8)))
    assert math.isclose(parts, float(full), rel_tol=1e-5)
    plain, metrics = value_loss(v, old, ret, m, clip=0.0)
    assert math.isclose(float(plain), float((0.5 * (v - ret) ** 2 * m).sum() / n), rel_tol=1e-5)
    assert metrics["value_clip_frac"] == 0.0
    empty, _ = value_loss(v, old, ret, torch.zeros(8, 6), clip=0.2)
    assert float(empty) == 0.0


def test_whiten_matches_loop_and_handles_empty_and_constant():
    rng = random.Random(2)
    m = _ragged_mask(rng, 5, 9)
    m[1, 2] = m[1, 4] = 1.0
    x = torch.randn(5, 9, dtype=torch.float64)
    out = whiten(_garbage(x, m), m)
    vals = [float(x[i, j]) for i in range(5) for j in range(9) if m[i, j] > 0]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((a - mean) ** 2 for a in vals) / len(vals))
    for i in range(5):
        for j in range(9):
            want = (float(x[i, j]) - mean) / (std + 1e-8) if m[i, j] > 0 else 0.0
            assert math.isclose(float(out[i, j]), want, rel_tol=1e-9, abs_tol=1e-12)
    scaled = whiten(x, m, shift_mean=False)
    torch.testing.assert_close(scaled[m > 0] - out[m > 0], torch.full_like(out[m > 0], mean))
    assert (whiten(x, torch.zeros(5, 9)) == 0).all()
    const = whiten(torch.full((2, 3), 4.0), torch.ones(2, 3))
    assert (const == 0).all()


def test_explained_variance():
    m = torch.tensor([[1, 1, 0.], [1, 1, 1]])
    ret = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, 5.0]])
    assert math.isclose(explained_variance(ret, ret, m), 1.0)
    mean = torch.full_like(ret, 3.0)
    assert math.isclose(explained_variance(mean, ret, m), 0.0, abs_tol=1e-12)
    assert math.isnan(explained_variance(ret, ret, torch.zeros(2, 3)))
    assert math.isnan(explained_variance(ret, torch.ones(2, 3), m))
