"""Token-level policy losses, their aggregations, and the log-prob helpers they need.

Conventions (B sequences, T tokens, V vocabulary; tensors aligned with ``Batch.input_ids``):
- ``logprobs[b, t]`` = log pi(input_ids[b, t] | input_ids[b, :t]); position 0 has no prefix and
  is 0.0 (``token_logprobs``). ``loss_mask[b, t]`` = 1 where token t is a policy token to train.
- Only ``loss_mask == 1`` tokens count: masked-out positions contribute neither loss nor
  gradient nor metrics, whatever values they hold.

Two registries, each with one signature:
- ``AGGREGATIONS``: ``agg(token_loss [B,T], mask [B,T], *, num_tokens=None, num_seqs=None,
  max_tokens=None) -> scalar``. The optional totals are the *whole mini-batch's* token count /
  sequence count: when the trainer splits a mini-batch into micro-batches and passes the full
  totals to every micro-batch, the micro-batch losses sum to exactly the full-batch loss (and so
  do their gradients). Left as None they default to this batch's own totals.
- ``POLICY_LOSSES`` (ppo_clip, gspo, cispo): ``fn(logprobs [B,T], old_logprobs [B,T], advantages [B], loss_mask [B,T],
  *, clip_low, clip_high, aggregation, num_tokens, num_seqs, max_tokens, is_weights)
  -> (scalar loss, metrics dict of plain floats)``.

Not here: computing logits (the trainer calls the model), the KL term (``kl.py``; the trainer
adds beta * agg(kl) itself), advantages (``advantages.py``), DPO/IPO preference losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rlvr.registry import Registry

AggregationFn = Callable[..., Tensor]
PolicyLossFn = Callable[..., tuple[Tensor, dict[str, float]]]
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")

# |log-ratio| cap before exp: keeps a stale or corrupt logprob from producing inf * 0 = nan.
# exp(20) ~ 5e8, far outside any clip range, so clipped losses are unchanged by it.
_MAX_LOG_RATIO = 20.0


# --------------------------------------------------------------------------- aggregations


@AGGREGATIONS.register("token_mean")
def token_mean(
    token_loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_tokens: int | None = None,
) -> Tensor:
    """Mean over all policy tokens of the batch: sum(loss * mask) / num_tokens.

    DAPO (Yu et al. 2025), Sec. 3.3 "token-level policy gradient loss": long sequences weigh in
    proportion to their length. ``num_tokens`` defaults to ``mask.sum()`` (at least 1, so an
    all-masked batch gives 0, not nan). ``num_seqs`` and ``max_tokens`` are unused.

    token_loss [B,T], mask [B,T] -> scalar.
    """
    if num_tokens is None:
        num_tokens = mask.sum().clamp(min=1)
    return (token_loss * mask).sum() / num_tokens


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    token_loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_tokens: int | None = None,
) -> Tensor:
    """Mean over sequences of each sequence's mean token loss.

    Original GRPO (Shao et al. 2024, DeepSeekMath, Eq. 3): (1/G) sum_i (1/|o_i|) sum_t loss_{i,t}.
    A sequence with no policy token contributes 0 but still counts in ``num_seqs``, which
    defaults to B. ``num_tokens`` and ``max_tokens`` are unused.

    token_loss [B,T], mask [B,T] -> scalar.
    """
    if num_seqs is None:
        num_seqs = mask.shape[0]
    per_seq = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / num_seqs


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    token_loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_tokens: int | None = None,
) -> Tensor:
    """Token sums divided by a constant: sum(loss * mask) / (num_seqs * max_tokens).

    Dr. GRPO (Liu et al. 2025, Sec. 3.1): dividing each sequence by its own length biases towards
    long wrong answers; divide by the generation budget ``max_tokens`` (required) instead.
    ``num_seqs`` defaults to B. ``num_tokens`` is unused.

    token_loss [B,T], mask [B,T] -> scalar.
    """
    if max_tokens is None:
        raise ValueError("seq_mean_token_sum_norm needs max_tokens (the generation budget)")
    if num_seqs is None:
        num_seqs = mask.shape[0]
    return (token_loss * mask).sum() / (num_seqs * max_tokens)


# --------------------------------------------------------------------------- policy losses


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi - log pi_old on the mask, 0 off it: off-mask values (0, -inf, nan, stale) never leak
    into a masked sum or its gradient."""
    return torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))


def _clip_metrics(ratio: Tensor, unclipped: Tensor, clipped: Tensor, adv: Tensor, log_ratio: Tensor,
                  mask: Tensor, clip_low: float, clip_high: float) -> dict[str, float]:
    """The PPO-style metrics over policy tokens: clip_frac (the clipped term is active),
    clip_frac_high / clip_frac_low (the bound that binds for A's sign) and approx_kl (k1)."""
    a = adv.expand_as(ratio)
    return {
        "clip_frac": _masked_mean((clipped > unclipped).to(mask.dtype), mask),
        "clip_frac_high": _masked_mean(((ratio > 1 + clip_high) & (a > 0)).to(mask.dtype), mask),
        "clip_frac_low": _masked_mean(((ratio < 1 - clip_low) & (a < 0)).to(mask.dtype), mask),
        "approx_kl": _masked_mean(-log_ratio, mask),
    }


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a policy loss computes from: the registry signature's arguments after the prologue
    every ``POLICY_LOSSES`` entry shares (``_policy_loss``)."""

    logprobs: Tensor
    """[B,T], requires grad."""
    mask: Tensor
    """``loss_mask`` in ``logprobs``' dtype, [B,T]."""
    adv: Tensor
    """The advantages as [B,1] (given [B]) or [B,T]."""
    log_ratio: Tensor
    """log pi - log pi_old on the mask, 0 off it (``_log_ratio``), [B,T]."""
    clip_low: float
    clip_high: float


def _policy_loss(name: str) -> Callable[[Callable[[PolicyLossInputs], tuple[Tensor, dict[str, float]]]], PolicyLossFn]:
    """Register ``core(x) -> (token_loss [B,T], metrics)`` in ``POLICY_LOSSES`` as a function of
    the registry signature (module docstring), named and documented as ``core``. The shared
    prologue and epilogue live here: the aggregation is looked up first (an unknown name raises
    before any work), the mask cast to ``logprobs``' dtype, [B] advantages made [B,1], the masked
    log-ratio taken; after ``core``, ``is_weights`` (no gradient) multiply each token's loss and
    ``AGGREGATIONS[aggregation]`` reduces it with the given totals."""

    def register(core: Callable[[PolicyLossInputs], tuple[Tensor, dict[str, float]]]) -> PolicyLossFn:
        def loss_fn(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor, *,
                    clip_low: float = 0.2, clip_high: float = 0.28, aggregation: str = "token_mean",
                    num_tokens: float | None = None, num_seqs: float | None = None, max_tokens: int | None = None,
                    is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
            agg = AGGREGATIONS.get(aggregation)
            mask = loss_mask.to(logprobs.dtype)
            adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
            # Off-mask positions get log-ratio 0 (rho = 1): their values can be anything (0, -inf,
            # stale) without leaking nan into the masked sum or its gradient.
            log_ratio = _log_ratio(logprobs, old_logprobs, mask)
            token_loss, metrics = core(PolicyLossInputs(logprobs, mask, adv, log_ratio, clip_low, clip_high))
            if is_weights is not None:
                token_loss = token_loss * is_weights.detach()
            return agg(token_loss, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_tokens=max_tokens), metrics

        loss_fn.__name__ = loss_fn.__qualname__ = core.__name__
        loss_fn.__doc__ = core.__doc__
        return POLICY_LOSSES.register(name)(loss_fn)

    return register


@_policy_loss("ppo_clip")
def ppo_clip(x: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric ("clip-higher") bounds.

    Schulman et al. 2017, "PPO", Eq. 7; clip-higher from DAPO (Yu et al. 2025), Eq. 10:
        rho_t  = exp(logprobs_t - old_logprobs_t)
        loss_t = -min(rho_t * A, clip(rho_t, 1 - clip_low, 1 + clip_high) * A)
    On the first on-policy step rho = 1 but the gradient still flows through ``logprobs``
    (d rho / d logprobs = rho), giving the plain policy gradient -A * grad log pi.
    ``is_weights`` (optional, [B,T], no gradient) multiply each token's loss: the truncated
    importance weights min(pi_old / pi_behaviour, C) of an asynchronous rollout
    (``penalties.truncated_is_weights``). The token losses are reduced by
    ``AGGREGATIONS[aggregation]`` with the given totals.

    logprobs [B,T] (requires grad), old_logprobs [B,T], advantages [B] (or [B,T]),
    loss_mask [B,T] -> (scalar loss, metrics). Metrics, over policy tokens only:
    ``clip_frac`` (share of tokens whose clipped term is active, i.e. no gradient),
    ``clip_frac_high`` (rho > 1 + clip_high, A > 0), ``clip_frac_low`` (rho < 1 - clip_low, A < 0),
    ``ratio_mean``, ``ratio_max`` (1.0 when there are no policy tokens) and ``approx_kl``
    (mean of old_logprobs - logprobs, the k1 estimate of KL(pi_old || pi)).
    """
    mask, adv = x.mask, x.adv
    ratio = x.log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - x.clip_low, 1.0 + x.clip_high) * adv
    token_loss = torch.maximum(unclipped, clipped)

    with torch.no_grad():
        on = mask > 0
        metrics = _clip_metrics(ratio, unclipped, clipped, adv, x.log_ratio, mask, x.clip_low, x.clip_high)
        metrics["ratio_mean"] = _masked_mean(ratio, mask) if on.any() else 1.0
        metrics["ratio_max"] = float(ratio[on].max()) if on.any() else 1.0
    return token_loss, metrics


@_policy_loss("gspo")
def gspo(x: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """GSPO: a sequence-level importance ratio, clipped per sequence.

    Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv 2507.18071), Eq. 5 (the
    objective) with its length-normalised sequence ratio s_i:
        s_i    = exp((1/|y_i|) sum_t (logprobs_t - old_logprobs_t))    over y_i's policy tokens
        loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)
    Written as the paper's GSPO-token variant so any ``AGGREGATIONS`` entry reduces it:
    s_{i,t} = sg[s_i] * pi_t / sg[pi_t], equal to s_i in value, with gradient s_i * grad log pi_t;
    loss_{i,t} = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, ...) A_{i,t}). With
    ``aggregation=seq_mean_token_mean`` this is exactly GSPO's objective, value and gradient
    ((1/G) sum_i loss_i, grad s_i = s_i * (1/|y_i|) sum_t grad log pi_t); other aggregations
    weigh the same sequence terms differently (``token_mean``: by length). Advantages [B] give
    GSPO; [B,T] give GSPO-token. The paper's clip ranges are tiny, 3e-4 below and 4e-4 above
    (``algo.clip_low=3e-4 algo.clip_high=4e-4``): a ratio of length-normalised log-probs moves
    far less than a token's. The log-ratio mean is capped at +-20 before exp, as in ``ppo_clip``.
    ``is_weights`` ([B,T], no gradient) multiply each token's loss, as in ``ppo_clip``.

    logprobs [B,T] (requires grad), old_logprobs [B,T], advantages [B] (or [B,T]),
    loss_mask [B,T] -> (scalar loss, metrics). Metrics are ``ppo_clip``'s, with s_i as every
    token's ratio: ``clip_frac`` / ``clip_frac_high`` / ``clip_frac_low`` are shares of policy
    *tokens* in clipped sequences (the paper's "fraction of clipped tokens"), ``ratio_mean`` and
    ``ratio_max`` are over the sequences with a policy token (1.0 with none), ``approx_kl`` is the
    token mean of old_logprobs - logprobs as in ``ppo_clip``.
    """
    mask, adv = x.mask, x.adv
    lengths = mask.sum(-1)
    seq_log_ratio = (x.log_ratio * mask).sum(-1) / lengths.clamp(min=1)
    seq_ratio = seq_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()  # s_i [B]
    safe_lp = torch.where(mask > 0, x.logprobs, torch.zeros_like(x.logprobs))
    ratio = seq_ratio.detach().unsqueeze(-1) * (safe_lp - safe_lp.detach()).exp()  # s_{i,t} [B,T]
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - x.clip_low, 1.0 + x.clip_high) * adv
    token_loss = torch.maximum(unclipped, clipped)

    with torch.no_grad():
        seqs = lengths > 0
        metrics = _clip_metrics(ratio, unclipped, clipped, adv, x.log_ratio, mask, x.clip_low, x.clip_high)
        metrics["ratio_mean"] = float(seq_ratio[seqs].mean()) if seqs.any() else 1.0
        metrics["ratio_max"] = float(seq_ratio[seqs].max()) if seqs.any() else 1.0
    return token_loss, metrics


@_policy_loss("cispo")
def cispo(x: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """CISPO: a clipped, detached importance weight times the REINFORCE term; no token is dropped.

    MiniMax-M1 technical report (Chen et al. 2025, arXiv 2506.13585), Sec. 3.1, Eq. 4-5:
        r_t    = exp(logprobs_t - old_logprobs_t)
        loss_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * logprobs_t
    The gradient is -w_t * A * grad log pi_t for every policy token, clipped or not (PPO's
    clipping zeroes the gradient of a clipped token). The report imposes no lower bound ("setting
    eps_low^IS to a large value") and tunes only eps_high^IS: ``algo.clip_low=1.0`` makes the
    floor 0, i.e. none. Its aggregation is ``token_mean`` (1 / sum_i |o_i|). The loss *value* is
    a surrogate (it contains log pi, not the objective); compare gradients, not values, with
    ``ppo_clip``. ``is_weights`` ([B,T], no gradient) multiply each token's loss, as in ``ppo_clip``.

    logprobs [B,T] (requires grad), old_logprobs [B,T], advantages [B] (or [B,T]),
    loss_mask [B,T] -> (scalar loss, metrics). Metrics over policy tokens: ``clip_frac`` (share
    of tokens whose weight was clipped, either side; whatever the sign of A, since the weight is
    clipped regardless), ``clip_frac_high`` (r > 1 + clip_high), ``clip_frac_low``
    (r < 1 - clip_low), ``ratio_mean``, ``ratio_max`` (unclipped r; 1.0 with no policy token),
    ``approx_kl`` (mean of old_logprobs - logprobs, as ``ppo_clip``).
    """
    mask = x.mask
    ratio = x.log_ratio.detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    weight = ratio.clamp(1.0 - x.clip_low, 1.0 + x.clip_high)
    safe_lp = torch.where(mask > 0, x.logprobs, torch.zeros_like(x.logprobs))
    token_loss = -weight * x.adv * safe_lp

    with torch.no_grad():
        on = mask > 0
        high = (ratio > 1 + x.clip_high).to(mask.dtype)
        low = (ratio < 1 - x.clip_low).to(mask.dtype)
        metrics = {
            "clip_frac": _masked_mean(high + low, mask),
            "clip_frac_high": _masked_mean(high, mask),
            "clip_frac_low": _masked_mean(low, mask),
            "ratio_mean": _masked_mean(ratio, mask) if on.any() else 1.0,
            "ratio_max": float(ratio[on].max()) if on.any() else 1.0,
            "approx_kl": _masked_mean(-x.log_ratio, mask),
        }
    return token_loss, metrics


# --------------------------------------------------------------------------- log-probs and SFT


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Log-probability of each token given its prefix, aligned with ``input_ids``.

    out[b, t] = log softmax(logits[b, t - 1])[input_ids[b, t]] for t >= 1; out[b, 0] = 0.0
    (the first token has no prefix in the sequence).

    Memory: never materialises a [B,T,V] log-softmax. In fp32/fp64 it is gather - logsumexp
    ([B,T] outputs only); in half precision, where logsumexp loses too much accuracy, it takes
    log_softmax one sequence at a time (as TRL's ``selective_log_softmax``).

    logits [B,T,V], input_ids [B,T] long -> [B,T] (dtype of logits).
    """
    logits, targets = logits[:, :-1], input_ids[:, 1:].unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    else:
        picked = torch.stack(
            [row.log_softmax(-1).gather(-1, tgt).squeeze(-1) for row, tgt in zip(logits, targets)]
        )
    return F.pad(picked, (1, 0), value=0.0)


def sft_loss(logits: Tensor, input_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """Next-token cross entropy, averaged over target tokens where ``loss_mask`` is 1.

    ``loss_mask`` marks *targets*: token t is predicted from ``logits[:, t - 1]``, so
    ``loss_mask[:, 0]`` is ignored (no prefix predicts it). Returns 0 when nothing is masked in.

    logits [B,T,V], input_ids [B,T] long, loss_mask [B,T] -> scalar.
    """
    mask = loss_mask[:, 1:].to(logits.dtype)
    nll = -token_logprobs(logits, input_ids)[:, 1:]
    return (nll * mask).sum() / mask.sum().clamp(min=1)
