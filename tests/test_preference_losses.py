"""Preference losses (``rlvr.algos.preference``) against plain per-pair loops, their identities and errors."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algos.preference import PREFERENCE_LOSSES, preference_metrics, sequence_logps
from rlvr.errors import UserError

B = 7


# --------------------------------------------------------------------------- per-pair loop references


def log_sigmoid(x: float) -> float:
    """log(1 / (1 + e^-x)) without overflow."""
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def loop_sigmoid(c, r, rc, rr, lc, lr, beta, eps, gamma):
    h = (c - rc) - (r - rr)
    return -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h), beta * (c - rc), beta * (r - rr)


def loop_robust(c, r, rc, rr, lc, lr, beta, eps, gamma):
    h = (c - rc) - (r - rr)
    loss = ((1 - eps) * -log_sigmoid(beta * h) + eps * log_sigmoid(-beta * h)) / (1 - 2 * eps)
    return loss, beta * (c - rc), beta * (r - rr)


def loop_ipo(c, r, rc, rr, lc, lr, beta, eps, gamma):
    h_avg = (c - rc) / max(lc, 1) - (r - rr) / max(lr, 1)
    return (h_avg - 1 / (2 * beta)) ** 2, beta * (c - rc), beta * (r - rr)


def loop_simpo(c, r, rc, rr, lc, lr, beta, eps, gamma):
    z = beta * (c / max(lc, 1) - r / max(lr, 1)) - gamma
    return -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z), beta * c / max(lc, 1), beta * r / max(lr, 1)


LOOPS = {"sigmoid": loop_sigmoid, "robust": loop_robust, "ipo": loop_ipo, "simpo": loop_simpo}
# settings each loss accepts: (beta, label_smoothing, gamma)
SETTINGS = {
    "sigmoid": [(0.1, 0.0, 0.0), (0.5, 0.1, 0.0), (2.0, 0.3, 0.0), (1.0, 0.5, 0.0)],
    "robust": [(0.1, 0.0, 0.0), (0.5, 0.1, 0.0), (2.0, 0.3, 0.0), (1.0, 0.45, 0.0)],
    "ipo": [(0.1, 0.0, 0.0), (0.5, 0.0, 0.0), (2.0, 0.0, 0.0)],
    "simpo": [(2.0, 0.0, 0.0), (2.0, 0.0, 0.7), (0.5, 0.1, 1.2), (2.5, 0.3, 0.5)],
}


def make_pairs(seed: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Random log-prob sums of B pairs: policy near the reference, lengths 1..40 (one of 1)."""
    gen = torch.Generator().manual_seed(seed)
    lc = torch.randint(1, 41, (B,), generator=gen)
    lr = torch.randint(1, 41, (B,), generator=gen)
    lc[0] = 1
    ref_c = -torch.rand(B, generator=gen, dtype=dtype) * 3 * lc
    ref_r = -torch.rand(B, generator=gen, dtype=dtype) * 3 * lr
    c = ref_c + torch.randn(B, generator=gen, dtype=dtype) * 4
    r = ref_r + torch.randn(B, generator=gen, dtype=dtype) * 4
    return dict(chosen_logps=c, rejected_logps=r, ref_chosen_logps=ref_c, ref_rejected_logps=ref_r,
                chosen_lengths=lc, rejected_lengths=lr)


def call(name: str, pairs: dict, **kw):
    p = pairs
    return PREFERENCE_LOSSES.get(name)(p["chosen_logps"], p["rejected_logps"], p["ref_chosen_logps"],
                                       p["ref_rejected_logps"], chosen_lengths=p["chosen_lengths"],
                                       rejected_lengths=p["rejected_lengths"], **kw)


def test_every_preference_loss_has_a_loop_reference_and_settings():
    assert PREFERENCE_LOSSES.names() and set(PREFERENCE_LOSSES.names()) == set(LOOPS) == set(SETTINGS)


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_per_pair_loop(name, seed):
    pairs = make_pairs(seed)
    lists = {k: v.tolist() for k, v in pairs.items()}
    assert any(eps > 0 for _, eps, _ in SETTINGS[name]) or name == "ipo"
    for beta, eps, gamma in SETTINGS[name]:
        loss, chosen_rewards, rejected_rewards = call(name, pairs, beta=beta, label_smoothing=eps, gamma=gamma)
        assert loss.shape == chosen_rewards.shape == rejected_rewards.shape == (B,)
        for b in range(B):
            want = LOOPS[name](*(lists[k][b] for k in ("chosen_logps", "rejected_logps", "ref_chosen_logps",
                                                        "ref_rejected_logps", "chosen_lengths", "rejected_lengths")),
                               beta, eps, gamma)
            got = (float(loss[b]), float(chosen_rewards[b]), float(rejected_rewards[b]))
            for w, g, what in zip(want, got, ("loss", "chosen reward", "rejected reward")):
                assert abs(w - g) <= 1e-6, f"{name} beta={beta} eps={eps} gamma={gamma} pair {b} {what}: {g} != {w}"


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
def test_float32_close_to_float64(name):
    pairs = make_pairs(3)
    beta, eps, gamma = SETTINGS[name][1]
    want = call(name, pairs, beta=beta, label_smoothing=eps, gamma=gamma)
    got = call(name, {k: v.float() if v.is_floating_point() else v for k, v in pairs.items()},
               beta=beta, label_smoothing=eps, gamma=gamma)
    for w, g in zip(want, got):
        assert g.dtype == torch.float32
        assert torch.allclose(g.double(), w, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
def test_loss_falls_as_the_chosen_log_prob_rises_and_the_rejected_falls(name):
    """On pairs the policy gets wrong (the chosen response less likely than the rejected one, relative
    to the reference and per token). Beyond that, IPO and the label-smoothed losses have a finite target
    margin (tested below), so the direction is only guaranteed below it."""
    pairs = make_pairs(4)
    pairs["ref_chosen_logps"] = -2.0 * pairs["chosen_lengths"].double()
    pairs["ref_rejected_logps"] = -2.0 * pairs["rejected_lengths"].double()
    pairs["chosen_logps"] = pairs["ref_chosen_logps"] - 0.5
    pairs["rejected_logps"] = pairs["ref_rejected_logps"] + 0.5
    for beta, eps, gamma in SETTINGS[name]:
        c = pairs["chosen_logps"].clone().requires_grad_(True)
        r = pairs["rejected_logps"].clone().requires_grad_(True)
        loss, _, _ = call(name, dict(pairs, chosen_logps=c, rejected_logps=r), beta=beta, label_smoothing=eps,
                          gamma=gamma)
        loss.sum().backward()
        assert torch.all(c.grad < 0), f"{name} {beta, eps, gamma}: d loss / d chosen = {c.grad}"
        assert torch.all(r.grad > 0), f"{name} {beta, eps, gamma}: d loss / d rejected = {r.grad}"
        with torch.no_grad():
            up, _, _ = call(name, dict(pairs, chosen_logps=c + 1e-3), beta=beta, label_smoothing=eps, gamma=gamma)
            down, _, _ = call(name, dict(pairs, rejected_logps=r - 1e-3), beta=beta, label_smoothing=eps, gamma=gamma)
        assert torch.all(up < loss) and torch.all(down < loss), name


@pytest.mark.parametrize("name", ["sigmoid", "simpo"])
@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothing_puts_the_optimum_at_sigma_z_equal_one_minus_eps(name, eps):
    """-(1 - eps) log sigma(z) - eps log sigma(-z) has d/dz = sigma(z) - (1 - eps): minimal at
    z = log((1 - eps) / eps), the soft label's log-odds."""
    pairs = make_pairs(20)
    beta, z_star = 0.5, math.log((1 - eps) / eps)
    if name == "sigmoid":  # z = beta h
        c = pairs["ref_chosen_logps"] + z_star / beta + (pairs["rejected_logps"] - pairs["ref_rejected_logps"])
    else:  # z = beta (c / |c| - r / |r|), gamma = 0
        lc = pairs["chosen_lengths"].double()
        c = lc * (z_star / beta + pairs["rejected_logps"] / pairs["rejected_lengths"].double())
    c = c.detach().requires_grad_(True)
    loss, _, _ = call(name, dict(pairs, chosen_logps=c), beta=beta, label_smoothing=eps)
    loss.sum().backward()
    assert torch.allclose(c.grad, torch.zeros(B, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(loss, torch.full((B,), -(1 - eps) * math.log(1 - eps) - eps * math.log(eps),
                                           dtype=torch.float64))


def test_ipo_pulls_a_margin_above_its_target_back_down():
    pairs = make_pairs(5)
    beta = 0.5  # target h_avg = 1
    lc = pairs["chosen_lengths"].double()
    c = (pairs["ref_chosen_logps"] + 3.0 * lc).requires_grad_(True)  # h_avg = 3 + 0 > 1
    r = pairs["ref_rejected_logps"].clone()
    loss, _, _ = call("ipo", dict(pairs, chosen_logps=c, rejected_logps=r), beta=beta)
    loss.sum().backward()
    assert torch.all(c.grad > 0)
    assert torch.allclose(loss, torch.full((B,), 4.0, dtype=torch.float64))


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
def test_rewards_are_detached(name):
    pairs = make_pairs(6)
    c = pairs["chosen_logps"].clone().requires_grad_(True)
    _, chosen_rewards, rejected_rewards = call(name, dict(pairs, chosen_logps=c), beta=SETTINGS[name][0][0])
    assert not chosen_rewards.requires_grad and not rejected_rewards.requires_grad


# --------------------------------------------------------------------------- identities


@pytest.mark.parametrize("beta", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("eps", [0.0, 0.2, 0.5])
def test_sigmoid_at_zero_margin_is_log_2(beta, eps):
    pairs = make_pairs(7)
    pairs["chosen_logps"] = pairs["ref_chosen_logps"] + 1.5  # both log-ratios 1.5: h = 0
    pairs["rejected_logps"] = pairs["ref_rejected_logps"] + 1.5
    loss, _, _ = call("sigmoid", pairs, beta=beta, label_smoothing=eps)
    assert torch.allclose(loss, torch.full((B,), math.log(2), dtype=torch.float64), atol=1e-12)


def test_cdpo_with_zero_smoothing_is_dpo_and_mixes_the_two_label_directions():
    pairs = make_pairs(8)
    beta, p = 0.3, pairs
    h = (p["chosen_logps"] - p["ref_chosen_logps"]) - (p["rejected_logps"] - p["ref_rejected_logps"])
    dpo = [-log_sigmoid(beta * x) for x in h.tolist()]  # Rafailov et al. Eq. 7, pair by pair
    plain, _, _ = call("sigmoid", pairs, beta=beta)
    zero, _, _ = call("sigmoid", pairs, beta=beta, label_smoothing=0.0)
    assert torch.equal(plain, zero)
    assert max(abs(a - b) for a, b in zip(zero.tolist(), dpo)) < 1e-12
    # cDPO = (1 - eps) DPO(chosen > rejected) + eps DPO(rejected > chosen)
    swapped = dict(chosen_logps=p["rejected_logps"], rejected_logps=p["chosen_logps"],
                   ref_chosen_logps=p["ref_rejected_logps"], ref_rejected_logps=p["ref_chosen_logps"],
                   chosen_lengths=p["rejected_lengths"], rejected_lengths=p["chosen_lengths"])
    flipped, _, _ = call("sigmoid", swapped, beta=beta)
    cdpo, _, _ = call("sigmoid", pairs, beta=beta, label_smoothing=0.2)
    assert torch.allclose(cdpo, 0.8 * zero + 0.2 * flipped, atol=1e-12)


def test_robust_dpo_is_unbiased_under_label_flips():
    """Chowdhury et al.: flipping each label with probability eps, the expected rDPO loss is the clean DPO loss."""
    pairs = p = make_pairs(9)
    swapped = dict(chosen_logps=p["rejected_logps"], rejected_logps=p["chosen_logps"],
                   ref_chosen_logps=p["ref_rejected_logps"], ref_rejected_logps=p["ref_chosen_logps"],
                   chosen_lengths=p["rejected_lengths"], rejected_lengths=p["chosen_lengths"])
    clean, _, _ = call("sigmoid", pairs, beta=0.4)
    assert torch.allclose(call("robust", pairs, beta=0.4)[0], clean, atol=1e-12)  # eps = 0 is DPO
    for eps in (0.1, 0.3, 0.45):
        kept, _, _ = call("robust", pairs, beta=0.4, label_smoothing=eps)
        flipped, _, _ = call("robust", swapped, beta=0.4, label_smoothing=eps)
        assert torch.allclose((1 - eps) * kept + eps * flipped, clean, atol=1e-10), eps


def test_ipo_is_zero_at_its_target_margin_and_length_averaged():
    pairs = make_pairs(10)
    beta = 0.25  # target h_avg = 2
    lc, lr = pairs["chosen_lengths"].double(), pairs["rejected_lengths"].double()
    pairs["chosen_logps"] = pairs["ref_chosen_logps"] + 1.5 * lc  # chosen log-ratio per token 1.5
    pairs["rejected_logps"] = pairs["ref_rejected_logps"] - 0.5 * lr  # rejected -0.5: h_avg = 2
    loss, chosen_rewards, _ = call("ipo", pairs, beta=beta)
    assert torch.allclose(loss, torch.zeros(B, dtype=torch.float64), atol=1e-20)
    assert torch.allclose(chosen_rewards, beta * 1.5 * lc)  # rewards are not length-averaged (TRL's)


def test_simpo_ignores_the_reference_and_is_length_normalised():
    pairs = make_pairs(11)
    with_ref = call("simpo", pairs, beta=2.0, gamma=0.5, label_smoothing=0.1)
    no_ref = PREFERENCE_LOSSES.get("simpo")(pairs["chosen_logps"], pairs["rejected_logps"], None, None, beta=2.0,
                                            gamma=0.5, label_smoothing=0.1, chosen_lengths=pairs["chosen_lengths"],
                                            rejected_lengths=pairs["rejected_lengths"])
    for a, b in zip(with_ref, no_ref):
        assert torch.equal(a, b)
    # every token's log-prob one nat higher in both responses: the same loss
    shifted = dict(pairs, chosen_logps=pairs["chosen_logps"] + pairs["chosen_lengths"],
                   rejected_logps=pairs["rejected_logps"] + pairs["rejected_lengths"])
    assert torch.allclose(call("simpo", shifted, beta=2.0, gamma=0.5)[0], call("simpo", pairs, beta=2.0, gamma=0.5)[0])
    # equal per-token averages: the loss is -log sigma(-gamma), whatever the lengths
    even = dict(pairs, chosen_logps=-2.0 * pairs["chosen_lengths"].double(),
                rejected_logps=-2.0 * pairs["rejected_lengths"].double())
    loss, chosen_rewards, rejected_rewards = call("simpo", even, beta=2.0, gamma=0.7)
    assert torch.allclose(loss, torch.full((B,), -log_sigmoid(-0.7), dtype=torch.float64))
    assert torch.allclose(chosen_rewards, torch.full((B,), -4.0, dtype=torch.float64))
    assert torch.equal(chosen_rewards, rejected_rewards)


@pytest.mark.parametrize("name", ["sigmoid", "robust", "ipo"])
def test_reference_based_losses_depend_on_log_ratios_only(name):
    pairs = make_pairs(12)
    base = call(name, pairs, beta=0.5)
    moved = dict(pairs, chosen_logps=pairs["chosen_logps"] - 7.0, ref_chosen_logps=pairs["ref_chosen_logps"] - 7.0,
                 rejected_logps=pairs["rejected_logps"] + 3.0, ref_rejected_logps=pairs["ref_rejected_logps"] + 3.0)
    for a, b in zip(base, call(name, moved, beta=0.5)):
        assert torch.allclose(a, b, atol=1e-10)


def test_large_margins_stay_finite():
    pairs = make_pairs(13)
    for name in PREFERENCE_LOSSES.names():
        for sign in (1.0, -1.0):
            p = dict(pairs, chosen_logps=pairs["ref_chosen_logps"] + sign * 5000.0)
            beta, eps, gamma = SETTINGS[name][-1]
            loss, _, _ = call(name, p, beta=beta, label_smoothing=eps, gamma=gamma)
            assert torch.isfinite(loss).all(), (name, sign, loss)


# --------------------------------------------------------------------------- metrics and sequence_logps


def test_preference_metrics_by_hand():
    m = preference_metrics(torch.tensor([1.0, 0.5, -1.0, 2.0]), torch.tensor([0.0, 0.5, 0.0, -2.0]))
    assert m == {"rewards/chosen": 0.625, "rewards/rejected": -0.375, "rewards/accuracy": 0.5, "rewards/margin": 1.0}
    assert all(type(v) is float for v in m.values())


def test_sequence_logps_sums_the_masked_tokens_and_ignores_the_rest():
    gen = torch.Generator().manual_seed(14)
    lp = -torch.rand(4, 9, generator=gen, dtype=torch.float64) * 5
    mask = (torch.rand(4, 9, generator=gen) < 0.6).long()
    mask[3] = 0
    rng = random.Random(0)
    junk = lp.clone()
    off = [rng.choice([float("-inf"), float("nan"), 1e30]) for _ in range(int((mask == 0).sum()))]
    junk[mask == 0] = torch.tensor(off, dtype=torch.float64)
    junk.requires_grad_(True)
    sums, lengths = sequence_logps(junk, mask)
    for b in range(4):
        assert abs(sums[b].item() - sum(lp[b, t].item() for t in range(9) if mask[b, t])) < 1e-12
        assert int(lengths[b]) == int(mask[b].sum())
    assert lengths.dtype == torch.long and sums[3].item() == 0.0
    sums.sum().backward()
    assert torch.equal(junk.grad, mask.double())


# --------------------------------------------------------------------------- errors


def test_unknown_loss_names_the_choices():
    with pytest.raises(UserError, match="sigmoid"):
        PREFERENCE_LOSSES.get("dpo")


@pytest.mark.parametrize("name", ["sigmoid", "robust", "ipo"])
@pytest.mark.parametrize("missing", ["ref_chosen_logps", "ref_rejected_logps"])
def test_reference_based_losses_need_reference_log_probs(name, missing):
    pairs = dict(make_pairs(15), **{missing: None})
    with pytest.raises(ValueError, match=missing):
        call(name, pairs, beta=0.1)


@pytest.mark.parametrize("name", ["ipo", "simpo"])
@pytest.mark.parametrize("missing", ["chosen_lengths", "rejected_lengths"])
def test_length_normalised_losses_need_lengths(name, missing):
    pairs = dict(make_pairs(16), **{missing: None})
    with pytest.raises(ValueError, match=missing):
        call(name, pairs, beta=2.0)


@pytest.mark.parametrize("name, kw, argument", [
    ("robust", dict(beta=0.1, label_smoothing=0.5), "label_smoothing"),
    ("robust", dict(beta=0.1, label_smoothing=-0.1), "label_smoothing"),
    ("sigmoid", dict(beta=0.1, label_smoothing=0.6), "label_smoothing"),
    ("simpo", dict(beta=2.0, label_smoothing=0.51), "label_smoothing"),
    ("ipo", dict(beta=0.1, label_smoothing=0.1), "label_smoothing"),
    ("sigmoid", dict(beta=0.1, gamma=0.5), "gamma"),
    ("robust", dict(beta=0.1, gamma=0.5), "gamma"),
    ("ipo", dict(beta=0.1, gamma=0.5), "gamma"),
    ("simpo", dict(beta=2.0, gamma=float("nan")), "gamma"),
    ("sigmoid", dict(beta=0.0), "beta"),
    ("ipo", dict(beta=-1.0), "beta"),
    ("simpo", dict(beta=float("inf")), "beta"),
])
def test_bad_settings_raise_naming_the_argument(name, kw, argument):
    with pytest.raises(ValueError, match=argument):
        call(name, make_pairs(17), **kw)


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
def test_mismatched_shapes_raise_naming_the_tensor(name):
    pairs = make_pairs(18)
    beta = SETTINGS[name][0][0]
    with pytest.raises(ValueError, match="rejected_logps"):
        call(name, dict(pairs, rejected_logps=pairs["rejected_logps"][:-1]), beta=beta)
    with pytest.raises(ValueError, match="chosen_logps"):
        call(name, dict(pairs, chosen_logps=pairs["chosen_logps"].unsqueeze(0)), beta=beta)
    with pytest.raises(ValueError, match="rejected_lengths" if name in ("ipo", "simpo") else "ref_rejected_logps"):
        bad = "rejected_lengths" if name in ("ipo", "simpo") else "ref_rejected_logps"
        call(name, dict(pairs, **{bad: pairs[bad][:3]}), beta=beta)


def test_helpers_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="chosen_rewards"):
        preference_metrics(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="chosen_rewards"):
        preference_metrics(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="token_logps"):
        sequence_logps(torch.zeros(2, 3), torch.zeros(2, 4))

