"""Aggregations, ppo_clip, token_logprobs and sft_loss against plain per-token loops."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algos import AGGREGATIONS, POLICY_LOSSES, sft_loss, token_logprobs
from rlvr.errors import UserError

B, T, V, MAX_TOKENS = 5, 7, 11, 16


def make_mask(gen: torch.Generator) -> torch.Tensor:
    """Random 0/1 mask with ragged rows; row 0 always has tokens, one row may be empty."""
    mask = (torch.rand(B, T, generator=gen) < 0.7).double()
    mask[0, 2] = 1.0
    return mask


def make_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    new = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return new, old, adv, make_mask(gen)


# --------------------------------------------------------------------------- aggregation loops


def ref_token_mean(loss, mask, max_tokens):
    num = sum(loss[b][t] * mask[b][t] for b in range(B) for t in range(T))
    return num / max(sum(mask[b][t] for b in range(B) for t in range(T)), 1)


def ref_seq_mean_token_mean(loss, mask, max_tokens):
    total = 0.0
    for b in range(B):
        n = sum(mask[b])
        total += sum(loss[b][t] * mask[b][t] for t in range(T)) / max(n, 1)
    return total / B


def ref_seq_mean_token_sum_norm(loss, mask, max_tokens):
    return sum(loss[b][t] * mask[b][t] for b in range(B) for t in range(T)) / (B * max_tokens)


AGG_REFERENCES = {
    "token_mean": ref_token_mean,
    "seq_mean_token_mean": ref_seq_mean_token_mean,
    "seq_mean_token_sum_norm": ref_seq_mean_token_sum_norm,
}


def test_every_aggregation_has_a_reference():
    assert set(AGGREGATIONS.names()) == set(AGG_REFERENCES)


@pytest.mark.parametrize("name", sorted(AGG_REFERENCES))
@pytest.mark.parametrize("seed", range(4))
def test_aggregation_matches_loop(name, seed):
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = make_mask(gen)
    got = AGGREGATIONS.get(name)(loss, mask, max_tokens=MAX_TOKENS)
    want = AGG_REFERENCES[name](loss.tolist(), mask.tolist(), MAX_TOKENS)
    assert got.dim() == 0
    assert math.isclose(float(got), want, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("name", sorted(AGG_REFERENCES))
@pytest.mark.parametrize("splits", [[1, 1, 1, 1, 1], [2, 3], [4, 1], [5]])
def test_aggregation_grad_accumulation_invariance(name, splits):
    """Summing micro-batch losses computed with full-batch totals == the full-batch loss,
    and the accumulated gradient == the full-batch gradient."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = make_mask(gen)
    agg = AGGREGATIONS.get(name)
    totals = dict(num_tokens=float(mask.sum()), num_seqs=float(B), max_tokens=MAX_TOKENS)

    full_param = base.clone().requires_grad_(True)
    full = agg(full_param.square(), mask, max_tokens=MAX_TOKENS)
    full.backward()

    micro_param = base.clone().requires_grad_(True)
    accumulated = 0.0
    for rows in torch.split(torch.arange(B), splits):
        part = agg(micro_param[rows].square(), mask[rows], **totals)
        part.backward()
        accumulated += float(part.detach())
    assert math.isclose(accumulated, float(full.detach()), rel_tol=1e-12)
    torch.testing.assert_close(micro_param.grad, full_param.grad, rtol=1e-12, atol=1e-15)


def test_dr_grpo_aggregation_needs_max_tokens():
    with pytest.raises(ValueError, match="max_tokens"):
        AGGREGATIONS.get("seq_mean_token_sum_norm")(torch.ones(2, 3), torch.ones(2, 3))


def test_empty_mask_gives_zero_not_nan():
    for name in AGGREGATIONS:
        out = AGGREGATIONS.get(name)(torch.ones(2, 3), torch.zeros(2, 3), max_tokens=4)
        assert float(out) == 0.0, name


# --------------------------------------------------------------------------- ppo_clip


def ref_ppo_token_losses(new, old, adv, clip_low, clip_high):
    """Per-token loop: -min(rho*A, clip(rho, 1-cl, 1+ch)*A)."""
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            rho = math.exp(new[b][t] - old[b][t])
            clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
            out[b][t] = -min(rho * adv[b], clipped * adv[b])
    return out


@pytest.mark.parametrize("aggregation", sorted(AGG_REFERENCES))
@pytest.mark.parametrize("seed", range(4))
def test_ppo_clip_matches_loop(aggregation, seed):
    new, old, adv, mask = make_inputs(seed)
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(
        new, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_tokens=MAX_TOKENS
    )
    token = ref_ppo_token_losses(new.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28)
    want = AGG_REFERENCES[aggregation](token, mask.tolist(), MAX_TOKENS)
    assert math.isclose(loss.item(), want, rel_tol=1e-12, abs_tol=1e-12)
    assert all(isinstance(v, float) for v in metrics.values())
    on = [(b, t) for b in range(B) for t in range(T) if mask[b, t] > 0]
    ratios = [math.exp(new[b, t] - old[b, t]) for b, t in on]
    assert math.isclose(metrics["ratio_mean"], sum(ratios) / len(ratios), rel_tol=1e-12)
    assert math.isclose(metrics["ratio_max"], max(ratios), rel_tol=1e-12)
    kl = sum(float(old[b, t] - new[b, t]) for b, t in on) / len(on)
    assert math.isclose(metrics["approx_kl"], kl, rel_tol=1e-9, abs_tol=1e-12)


def test_ppo_clip_higher_asymmetry():
    """Ratios beyond each bound, with both advantage signs: only the pessimistic side clips."""
    cl, ch = 0.2, 0.28
    rhos = [1.5, 1.25, 0.5, 0.85]  # above 1+ch, inside, below 1-cl, inside
    new = torch.tensor([[math.log(r) for r in rhos]] * 2, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 4, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.float64)
    ppo = POLICY_LOSSES.get("ppo_clip")
    loss, metrics = ppo(new, old, adv, mask, clip_low=cl, clip_high=ch, aggregation="seq_mean_token_sum_norm",
                        max_tokens=1, num_seqs=1)
    loss.backward()
    # A > 0: rho=1.5 is capped at 1.28 (no gradient); rho=0.5 is NOT clipped (min picks rho*A).
    # A < 0: rho=0.5 is floored at 0.8 (no gradient); rho=1.5 is NOT clipped.
    want_token = [[-1.28, -1.25, -0.5, -0.85], [1.5, 1.25, 0.8, 0.85]]
    assert math.isclose(loss.item(), sum(map(sum, want_token)), rel_tol=1e-12)
    want_grad = torch.tensor([[0.0, -1.25, -0.5, -0.85], [1.5, 1.25, 0.0, 0.85]], dtype=torch.float64)
    torch.testing.assert_close(new.grad, want_grad)  # d(-rho*A)/d logp = -rho*A
    assert metrics["clip_frac"] == 2 / 8
    assert metrics["clip_frac_high"] == 1 / 8 and metrics["clip_frac_low"] == 1 / 8
    # With a symmetric 0.2 the 1.25 ratio would also clip: the asymmetry matters.
    _, sym = ppo(new.detach(), old, adv, mask, clip_low=cl, clip_high=0.2)
    assert sym["clip_frac"] == 3 / 8


def test_on_policy_gradient_is_policy_gradient():
    """rho == 1 on the first step, but d loss / d logp = -A * mask / num_tokens (token_mean)."""
    new, _, adv, mask = make_inputs(1)
    new = new.clone().requires_grad_(True)
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(new, new.detach().clone(), adv, mask)
    loss.backward()
    assert metrics["ratio_mean"] == 1.0 and metrics["clip_frac"] == 0.0
    assert math.isclose(loss.item(), float(-(adv[:, None] * mask).sum() / mask.sum()), rel_tol=1e-12)
    torch.testing.assert_close(new.grad, -adv[:, None] * mask / mask.sum())


def test_is_weights_scale_token_losses_without_gradient():
    new, old, adv, mask = make_inputs(3)
    gen = torch.Generator().manual_seed(9)
    w = (torch.rand(B, T, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(new, old, adv, mask, is_weights=w)
    token = torch.tensor(ref_ppo_token_losses(new.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28),
                         dtype=torch.float64)
    want = (token * w.detach() * mask).sum() / mask.sum()
    assert math.isclose(loss.item(), float(want), rel_tol=1e-12)
    assert not loss.requires_grad  # only w could carry grad here, and it is detached


def test_ppo_unknown_aggregation_lists_choices():
    new, old, adv, mask = make_inputs(0)
    with pytest.raises(UserError, match="seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"):
        POLICY_LOSSES.get("ppo_clip")(new, old, adv, mask, aggregation="mean")
    with pytest.raises(UserError, match="ppo_clip"):
        POLICY_LOSSES.get("grpo_loss")


def test_every_policy_loss_has_one_signature():
    """Conformance: every registered loss runs with the shared keyword set and returns float metrics."""
    new, old, adv, mask = make_inputs(0)
    for name in POLICY_LOSSES:
        loss, metrics = POLICY_LOSSES.get(name)(
            new.clone().requires_grad_(True), old, adv, mask, clip_low=0.2, clip_high=0.28,
            aggregation="token_mean", num_tokens=None, num_seqs=None, max_tokens=None, is_weights=None,
        )
        assert loss.dim() == 0 and loss.requires_grad and math.isfinite(loss.item())
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


# --------------------------------------------------------------------------- every policy loss


def ref_loss_and_grad(name, new, old, adv, mask, aggregation, clip_low, clip_high, is_weights=None):
    """Plain per-token (GSPO: per-sequence) loops over 0-dim tensors, reduced by the loop
    aggregations above, differentiated by autograd: (loss float, d loss / d new [B,T])."""
    leaf = new.clone().requires_grad_(True)
    w = is_weights if is_weights is not None else torch.ones(B, T, dtype=torch.float64)
    m = mask.tolist()
    token = [[torch.zeros((), dtype=torch.float64) for _ in range(T)] for _ in range(B)]
    for b in range(B):
        a = float(adv[b])
        tokens = [t for t in range(T) if m[b][t] > 0]
        if name == "gspo" and tokens:
            s = torch.exp(sum(leaf[b, t] - old[b, t] for t in tokens) / len(tokens))
        for t in tokens:
            if name == "ppo_clip":
                rho = torch.exp(leaf[b, t] - old[b, t])
                term = -torch.minimum(rho * a, rho.clamp(1 - clip_low, 1 + clip_high) * a)
            elif name == "gspo":  # GSPO-token: sg[s_i] * pi_t / sg[pi_t]
                rho = s.detach() * torch.exp(leaf[b, t] - leaf[b, t].detach())
                term = -torch.minimum(rho * a, rho.clamp(1 - clip_low, 1 + clip_high) * a)
            else:  # cispo
                weight = min(max(math.exp(float(new[b, t] - old[b, t])), 1 - clip_low), 1 + clip_high)
                term = -weight * a * leaf[b, t]
            token[b][t] = term * float(w[b, t])
    total = AGG_REFERENCES[aggregation](token, m, MAX_TOKENS)
    if not torch.is_tensor(total) or not total.requires_grad:
        return float(total), torch.zeros(B, T, dtype=torch.float64)
    total.backward()
    return float(total.detach()), leaf.grad


def ref_gspo_sequence_loss(new, old, adv, mask, clip_low, clip_high):
    """The paper's GSPO objective (Zheng et al. 2025, Eq. 5) per sequence, no token form:
    (1/G) sum_i -min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log-ratio), full gradient."""
    leaf = new.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for b in range(B):
        tokens = [t for t in range(T) if mask[b, t] > 0]
        if not tokens:
            continue
        s = torch.exp(sum(leaf[b, t] - old[b, t] for t in tokens) / len(tokens))
        a = float(adv[b])
        total = total - torch.minimum(s * a, s.clamp(1 - clip_low, 1 + clip_high) * a)
    (total / B).backward()
    return float(total.detach() / B), leaf.grad


def make_off_policy_inputs(seed: int, spread: float):
    """Like make_inputs, with a larger log-ratio spread so some tokens and sequences clip."""
    new, old, adv, mask = make_inputs(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    return old + torch.randn(B, T, generator=gen, dtype=torch.float64) * spread, old, adv, mask


@pytest.mark.parametrize("name", sorted(["ppo_clip", "gspo", "cispo"]))
@pytest.mark.parametrize("aggregation", sorted(AGG_REFERENCES))
@pytest.mark.parametrize("seed", range(3))
def test_policy_loss_matches_loop_value_and_gradient(name, aggregation, seed):
    new, old, adv, mask = make_off_policy_inputs(seed, spread=0.3 if name != "gspo" else 0.05)
    gen = torch.Generator().manual_seed(50 + seed)
    w = torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    cl, ch = (0.02, 0.03) if name == "gspo" else (0.2, 0.28)
    for is_weights in (None, w):
        leaf = new.clone().requires_grad_(True)
        loss, _ = POLICY_LOSSES.get(name)(leaf, old, adv, mask, clip_low=cl, clip_high=ch, aggregation=aggregation,
                                          max_tokens=MAX_TOKENS, is_weights=is_weights)
        loss.backward()
        want, want_grad = ref_loss_and_grad(name, new, old, adv, mask, aggregation, cl, ch, is_weights)
        assert math.isclose(loss.item(), want, rel_tol=1e-10, abs_tol=1e-12)
        torch.testing.assert_close(leaf.grad, want_grad, rtol=1e-10, atol=1e-12)


def test_every_policy_loss_has_a_loop_reference():
    assert set(POLICY_LOSSES.names()) == {"ppo_clip", "gspo", "cispo"}


@pytest.mark.parametrize("seed", range(4))
def test_gspo_with_seq_mean_token_mean_is_the_papers_gspo(seed):
    """Value and gradient equal the per-sequence formula, with sequences clipped on both sides."""
    new, old, adv, mask = make_off_policy_inputs(seed, spread=0.05)
    cl, ch = 3e-3, 4e-3  # the paper's 3e-4 / 4e-4, scaled to this batch's log-ratio spread
    leaf = new.clone().requires_grad_(True)
    loss, metrics = POLICY_LOSSES.get("gspo")(leaf, old, adv, mask, clip_low=cl, clip_high=ch,
                                              aggregation="seq_mean_token_mean")
    loss.backward()
    want, want_grad = ref_gspo_sequence_loss(new, old, adv, mask, cl, ch)
    assert math.isclose(loss.item(), want, rel_tol=1e-10, abs_tol=1e-12)
    torch.testing.assert_close(leaf.grad, want_grad, rtol=1e-10, atol=1e-12)
    ratios = [math.exp(sum(float(new[b, t] - old[b, t]) for t in range(T) if mask[b, t]) / float(mask[b].sum()))
              for b in range(B) if mask[b].sum() > 0]
    assert math.isclose(metrics["ratio_mean"], sum(ratios) / len(ratios), rel_tol=1e-12)
    assert math.isclose(metrics["ratio_max"], max(ratios), rel_tol=1e-12)
    # clip_frac: the share of policy tokens in sequences whose clipped term is active
    clipped_tokens = 0.0
    for b in range(B):
        n = float(mask[b].sum())
        if n:
            s = math.exp(sum(float(new[b, t] - old[b, t]) for t in range(T) if mask[b, t]) / n)
            clipped_tokens += n * bool((adv[b] > 0 and s > 1 + ch) or (adv[b] < 0 and s < 1 - cl))
    assert math.isclose(metrics["clip_frac"], clipped_tokens / float(mask.sum()), rel_tol=1e-12)
    assert 0.0 < metrics["clip_frac"] < 1.0  # some sequences clipped, some not: both paths tested


def test_gspo_token_advantages_equal_sequence_advantages_when_constant():
    new, old, adv, mask = make_off_policy_inputs(1, spread=0.05)
    gspo = POLICY_LOSSES.get("gspo")
    for aggregation in AGG_REFERENCES:
        a = new.clone().requires_grad_(True)
        b = new.clone().requires_grad_(True)
        la, ma = gspo(a, old, adv, mask, clip_low=0.01, clip_high=0.01, aggregation=aggregation, max_tokens=MAX_TOKENS)
        lb, mb = gspo(b, old, adv[:, None].expand(B, T), mask, clip_low=0.01, clip_high=0.01, aggregation=aggregation,
                      max_tokens=MAX_TOKENS)
        la.backward()
        lb.backward()
        assert la.item() == lb.item() and ma == mb
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_cispo_keeps_the_gradient_of_clipped_tokens_where_ppo_clip_drops_it():
    cl, ch = 0.2, 0.28
    rhos = [1.5, 1.25, 0.5, 0.85]  # above 1+ch, inside, below 1-cl, inside
    new = torch.tensor([[math.log(r) for r in rhos]] * 2, dtype=torch.float64) - 1.0
    old = torch.full((2, 4), -1.0, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.float64)
    kw = dict(clip_low=cl, clip_high=ch, aggregation="token_mean")
    grads, metrics = {}, {}
    for name in ("ppo_clip", "cispo"):
        leaf = new.clone().requires_grad_(True)
        loss, metrics[name] = POLICY_LOSSES.get(name)(leaf, old, adv, mask, **kw)
        loss.backward()
        grads[name] = leaf.grad * 8  # undo token_mean's 1/8
    # ppo_clip: A > 0 at rho 1.5 and A < 0 at rho 0.5 are clipped, gradient 0
    assert grads["ppo_clip"][0, 0] == 0 and grads["ppo_clip"][1, 2] == 0
    # cispo: every token keeps -w * A, w the clipped weight, whatever A's sign
    w = torch.tensor([[1.28, 1.25, 0.8, 0.85]] * 2, dtype=torch.float64)
    torch.testing.assert_close(grads["cispo"], -w * adv[:, None])
    assert metrics["cispo"]["clip_frac"] == 4 / 8  # the weight clips regardless of A's sign
    assert metrics["cispo"]["clip_frac_high"] == 2 / 8 and metrics["cispo"]["clip_frac_low"] == 2 / 8
    # no lower bound (the MiniMax-M1 setting): clip_low = 1 leaves 0.5 unclipped
    leaf = new.clone().requires_grad_(True)
    loss, m = POLICY_LOSSES.get("cispo")(leaf, old, adv, mask, clip_low=1.0, clip_high=ch)
    loss.backward()
    torch.testing.assert_close(leaf.grad * 8, -torch.tensor([[1.28, 1.25, 0.5, 0.85]] * 2, dtype=torch.float64)
                               * adv[:, None])
    assert m["clip_frac_low"] == 0.0


@pytest.mark.parametrize("name", sorted(["ppo_clip", "gspo", "cispo"]))
@pytest.mark.parametrize("aggregation", sorted(AGG_REFERENCES))
@pytest.mark.parametrize("splits", [[1, 1, 1, 1, 1], [2, 3], [4, 1]])
def test_policy_loss_grad_accumulation_invariance(name, aggregation, splits):
    """Micro-batches given the mini-batch's totals sum to the full-batch loss and gradient."""
    new, old, adv, mask = make_off_policy_inputs(2, spread=0.3)
    gen = torch.Generator().manual_seed(7)
    w = torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    kw = dict(clip_low=0.05, clip_high=0.06, aggregation=aggregation)
    fn = POLICY_LOSSES.get(name)
    full_param = new.clone().requires_grad_(True)
    full, _ = fn(full_param, old, adv, mask, max_tokens=MAX_TOKENS, is_weights=w, **kw)
    full.backward()
    micro_param = new.clone().requires_grad_(True)
    totals = dict(num_tokens=float(mask.sum()), num_seqs=float(B), max_tokens=MAX_TOKENS)
    accumulated = 0.0
    for rows in torch.split(torch.arange(B), splits):
        part, _ = fn(micro_param[rows], old[rows], adv[rows], mask[rows], is_weights=w[rows], **totals, **kw)
        part.backward()
        accumulated += float(part.detach())
    assert math.isclose(accumulated, float(full.detach()), rel_tol=1e-12, abs_tol=1e-14)
    torch.testing.assert_close(micro_param.grad, full_param.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(["ppo_clip", "gspo", "cispo"]))
def test_policy_loss_edge_cases(name):
    """All-masked batch: loss 0, zero gradient, finite metrics. Off-mask garbage changes nothing.
    Huge log-ratios on the mask: finite loss and gradient."""
    fn = POLICY_LOSSES.get(name)
    new, old, adv, mask = make_inputs(4)
    for aggregation in AGG_REFERENCES:
        leaf = torch.full((B, T), -math.inf, dtype=torch.float64).requires_grad_(True)
        empty, metrics = fn(leaf, torch.full((B, T), math.nan, dtype=torch.float64), adv, torch.zeros(B, T),
                            aggregation=aggregation, max_tokens=MAX_TOKENS)
        empty.backward()
        assert empty.item() == 0.0 and torch.equal(leaf.grad, torch.zeros(B, T, dtype=torch.float64))
        assert all(math.isfinite(v) for v in metrics.values()) and metrics["ratio_max"] == 1.0

    base_param = new.clone().requires_grad_(True)
    base, base_metrics = fn(base_param, old, adv, mask)
    base.backward()
    off = mask == 0
    wild_new, wild_old = new.clone(), old.clone()
    wild_new[off], wild_old[off] = -math.inf, math.nan
    wild_param = wild_new.requires_grad_(True)
    wild, wild_metrics = fn(wild_param, wild_old, adv, mask, is_weights=torch.where(off, 1e9, 1.0))
    wild.backward()
    assert wild.item() == base.item() and wild_metrics == base_metrics
    torch.testing.assert_close(wild_param.grad, base_param.grad)
    assert torch.all(wild_param.grad[off] == 0)

    huge_param = (old + torch.where(torch.arange(T) % 2 == 0, 1e4, -1e4)).requires_grad_(True)
    huge, huge_metrics = fn(huge_param, old, adv, mask, clip_low=1.0, clip_high=0.28)
    huge.backward()
    assert math.isfinite(huge.item()) and torch.isfinite(huge_param.grad).all()
    assert all(math.isfinite(v) for v in huge_metrics.values())


# --------------------------------------------------------------------------- token_logprobs, sft_loss


def ref_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> list[list[float]]:
    out = []
    for b in range(logits.shape[0]):
        row = [0.0]
        for t in range(1, logits.shape[1]):
            z = logits[b, t - 1].tolist()
            lse = math.log(sum(math.exp(v) for v in z))
            row.append(z[int(ids[b, t])] - lse)
        out.append(row)
    return out


def make_lm(seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=gen, dtype=torch.float64) * 3).to(dtype)
    ids = torch.randint(0, V, (B, T), generator=gen)
    return logits, ids


def test_token_logprobs_matches_loop():
    logits, ids = make_lm(0)
    got = token_logprobs(logits, ids)
    assert got.shape == (B, T) and torch.all(got[:, 0] == 0)
    torch.testing.assert_close(got, torch.tensor(ref_logprobs(logits, ids), dtype=torch.float64))


def test_token_logprobs_half_precision_path():
    logits, ids = make_lm(1)
    got = token_logprobs(logits.to(torch.bfloat16), ids)
    assert got.dtype == torch.bfloat16
    want = token_logprobs(logits.to(torch.bfloat16).double(), ids)
    torch.testing.assert_close(got.double(), want, atol=0.1, rtol=0.02)


def test_sft_loss_matches_loop():
    logits, ids = make_lm(2)
    gen = torch.Generator().manual_seed(5)
    mask = (torch.rand(B, T, generator=gen) < 0.6).long()
    mask[:, 0] = 1  # position 0 has no prefix: must be ignored
    lp = ref_logprobs(logits, ids)
    terms = [-lp[b][t] for b in range(B) for t in range(1, T) if mask[b, t]]
    want = sum(terms) / len(terms)
    got = sft_loss(logits, ids, mask)
    assert math.isclose(float(got), want, rel_tol=1e-12)
    # Agrees with torch's cross entropy on the shifted targets.
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none"
    )
    m = mask[:, 1:].reshape(-1).double()
    assert math.isclose(float((ce * m).sum() / m.sum()), want, rel_tol=1e-12)


def test_sft_loss_gradient_flows_and_empty_mask_is_zero():
    logits, ids = make_lm(3)
    logits.requires_grad_(True)
    mask = torch.zeros(B, T)
    mask[1, 3] = 1
    sft_loss(logits, ids, mask).backward()
    nonzero_rows = logits.grad.abs().sum(-1).nonzero().tolist()
    assert nonzero_rows == [[1, 2]]  # only the logits that predict the one target token
    assert sft_loss(logits, ids, torch.zeros(B, T)).item() == 0.0


def test_every_estimator_and_loss_is_in_the_algorithms_table():
    from pathlib import Path

    from rlvr.algos import ADVANTAGES

    docs = (Path(__file__).parent.parent / "docs" / "algorithms.md").read_text()
    for key, registry in (("algo.advantage", ADVANTAGES), ("algo.policy_loss", POLICY_LOSSES)):
        for name in registry.names():
            assert f"`{key}={name}" in docs, f"docs/algorithms.md has no row with {key}={name}"
