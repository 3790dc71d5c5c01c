"""Pairwise preference losses (DPO family): one loss per (chosen, rejected) pair from sequence log-probs.

Conventions (B pairs):
- ``chosen_logps[b]`` / ``rejected_logps[b]`` = log pi(y | x) of the pair's chosen / rejected
  response: the SUM of its per-token log-probs over response tokens only (``sequence_logps``).
  ``ref_*_logps``: the same under the frozen reference model (no gradient expected).
- ``*_lengths[b]``: the number of response tokens of each response (the second output of
  ``sequence_logps``); the length-normalised losses (``ipo``, ``simpo``) divide by it, clamped to
  at least 1 (as TRL's IPO).
- h = (pi_c - ref_c) - (pi_r - ref_r), the difference of the two implicit rewards / beta.

One signature, registered in ``PREFERENCE_LOSSES``::

    fn(chosen_logps [B], rejected_logps [B], ref_chosen_logps [B] | None, ref_rejected_logps [B] | None,
       *, beta, label_smoothing=0.0, chosen_lengths=None, rejected_lengths=None, gamma=0.0)
    -> (loss_per_pair [B], chosen_rewards [B], rejected_rewards [B])

The caller reduces ``loss_per_pair`` (TRL: the mean over pairs). Rewards are detached, in TRL's
sense: beta * (pi - ref) for the reference-based losses, beta * pi / |y| for SimPO.
Every entry matches TRL 1.16 (``DPOTrainer`` ``loss_type`` sigmoid / robust / ipo; SimPO is
``trl.experimental.cpo.CPOTrainer`` ``loss_type="simpo"`` with ``cpo_alpha=0``), measured by
``benchmarks/dpo_vs_trl.py`` (largest |diff| 3.8e-6 in fp32; ``docs/algorithms.md``). One
extension: ``sigmoid`` takes ``label_smoothing`` (cDPO), which TRL 1.x's DPOTrainer no longer
applies to ``sigmoid``; it is checked against TRL's ``aot`` loss on one pair at a time, the same
formula when there is nothing to sort.

Arguments are validated and a bad one raises ``ValueError`` naming it: reference log-probs where a
loss needs them, lengths for ``ipo`` / ``simpo``, 0 <= label_smoothing <= 0.5 (< 0.5 for
``robust``), beta > 0, and a hyperparameter the loss has no use for set away from its default
(``gamma`` outside ``simpo``, ``label_smoothing`` for ``ipo``): a setting that would silently do
nothing is a configuration mistake. Inputs a loss does not use (lengths of the reference-based
losses, reference log-probs of ``simpo``) are accepted and ignored, so callers need not branch.

Not here: running the models (the trainer computes the four log-prob sums), the mean over pairs,
and the policy-gradient losses (``losses.py``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from rlvr.registry import Registry

PreferenceLossFn = Callable[..., tuple[Tensor, Tensor, Tensor]]
PREFERENCE_LOSSES: Registry[PreferenceLossFn] = Registry("preference loss")


# --------------------------------------------------------------------------- helpers


def sequence_logps(token_logps: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of each sequence's response-token log-probs, and its number of response tokens.

    ``mask[b, t]`` = 1 where token t is a response token (aligned with ``token_logps``, as
    ``loss_mask`` in ``losses.py``). Off-mask positions contribute nothing whatever they hold
    (0, -inf, nan), to the sum or its gradient.

    token_logps [B,T], mask [B,T] -> (sums [B] dtype of token_logps, lengths [B] long).
    """
    if token_logps.shape != mask.shape or token_logps.dim() != 2:
        raise ValueError(f"token_logps and mask must both be [B, T], got {tuple(token_logps.shape)} "
                         f"and {tuple(mask.shape)}")
    on = mask > 0
    sums = torch.where(on, token_logps, torch.zeros_like(token_logps)).sum(-1)
    return sums, on.sum(-1)


def preference_metrics(chosen_rewards: Tensor, rejected_rewards: Tensor) -> dict[str, float]:
    """TRL's reward metrics of a batch of pairs, as plain floats: ``rewards/chosen`` and
    ``rewards/rejected`` (means), ``rewards/accuracy`` (share of pairs with chosen > rejected,
    strictly; TRL's ``rewards/accuracies``) and ``rewards/margin`` (mean chosen - rejected; TRL's
    ``rewards/margins``).

    chosen_rewards [B], rejected_rewards [B] (B >= 1) -> dict.
    """
    if chosen_rewards.dim() != 1 or chosen_rewards.shape != rejected_rewards.shape or chosen_rewards.numel() == 0:
        raise ValueError(f"chosen_rewards and rejected_rewards must be 1-D of the same non-zero length, got "
                         f"{tuple(chosen_rewards.shape)} and {tuple(rejected_rewards.shape)}")
    c, r = chosen_rewards.detach().double(), rejected_rewards.detach().double()
    return {
        "rewards/chosen": float(c.mean()),
        "rewards/rejected": float(r.mean()),
        "rewards/accuracy": float((c > r).double().mean()),
        "rewards/margin": float((c - r).mean()),
    }


class _Pairs(NamedTuple):
    """A validated batch as the losses read it: log-prob sums [B], and lengths [B] as floats clamped
    to >= 1 (None where the loss does not use them, or was given none)."""

    chosen: Tensor
    rejected: Tensor
    ref_chosen: Tensor | None
    ref_rejected: Tensor | None
    chosen_len: Tensor | None
    rejected_len: Tensor | None


def _preference_loss(
    name: str,
    *,
    needs_ref: bool,
    needs_lengths: bool,
    smoothing_inclusive: bool = True,
    uses_smoothing: bool = True,
    uses_gamma: bool = False,
) -> Callable[[Callable[..., tuple[Tensor, Tensor, Tensor]]], PreferenceLossFn]:
    """Register ``core(pairs: _Pairs, beta, label_smoothing, gamma) -> (loss, chosen_rewards,
    rejected_rewards)`` as ``name`` with the registry signature, validating the arguments first
    (``ValueError`` naming the first bad one). The registered function carries the core's name and
    docstring."""

    def decorator(core: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> PreferenceLossFn:
        def loss_fn(
            chosen_logps: Tensor,
            rejected_logps: Tensor,
            ref_chosen_logps: Tensor | None,
            ref_rejected_logps: Tensor | None,
            *,
            beta: float,
            label_smoothing: float = 0.0,
            chosen_lengths: Tensor | None = None,
            rejected_lengths: Tensor | None = None,
            gamma: float = 0.0,
        ) -> tuple[Tensor, Tensor, Tensor]:
            shape = chosen_logps.shape
            if chosen_logps.dim() != 1:
                raise ValueError(f"{name}: chosen_logps must be 1-D [B], got shape {tuple(shape)}")
            given = {"rejected_logps": rejected_logps}
            required = [("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps)] * needs_ref
            required += [("chosen_lengths", chosen_lengths), ("rejected_lengths", rejected_lengths)] * needs_lengths
            for arg, value in required:
                if value is None:
                    kind = "a reference-based" if arg.startswith("ref_") else "a length-normalised"
                    raise ValueError(f"{name}: {arg} is required ({kind} loss)")
                given[arg] = value
            for arg, value in given.items():
                if value.shape != shape:
                    raise ValueError(f"{name}: {arg} has shape {tuple(value.shape)}, chosen_logps {tuple(shape)}")
            if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
                raise ValueError(f"{name}: beta must be a finite number > 0, got {beta!r}")
            if not uses_smoothing and label_smoothing != 0.0:
                raise ValueError(f"{name}: label_smoothing has no effect on this loss; got {label_smoothing!r}, "
                                 f"leave it 0")
            inside = label_smoothing <= 0.5 if smoothing_inclusive else label_smoothing < 0.5
            if not (0.0 <= label_smoothing and inside):
                bound = "<= 0.5" if smoothing_inclusive else "< 0.5"
                raise ValueError(f"{name}: label_smoothing must be >= 0 and {bound}, got {label_smoothing!r}")
            if not uses_gamma and gamma != 0.0:
                raise ValueError(f"{name}: gamma (simpo_gamma) is SimPO's target margin and has no effect here; "
                                 f"got {gamma!r}, leave it 0")
            if not math.isfinite(gamma):
                raise ValueError(f"{name}: gamma must be finite, got {gamma!r}")

            def length(n: Tensor | None) -> Tensor | None:
                return None if n is None or not needs_lengths else n.to(chosen_logps.dtype).clamp(min=1.0)

            pairs = _Pairs(chosen_logps, rejected_logps, ref_chosen_logps if needs_ref else None,
                           ref_rejected_logps if needs_ref else None, length(chosen_lengths), length(rejected_lengths))
            return core(pairs, beta, label_smoothing, gamma)

        loss_fn.__name__ = loss_fn.__qualname__ = core.__name__
        loss_fn.__doc__ = core.__doc__
        return PREFERENCE_LOSSES.register(name)(loss_fn)

    return decorator


def _smoothed_logistic(logits: Tensor, label_smoothing: float) -> Tensor:
    """-(1 - eps) log sigma(z) - eps log sigma(-z): the logistic loss with labels flipped w.p. eps."""
    loss = -F.logsigmoid(logits)
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-logits)
    return loss


def _log_ratios(p: _Pairs) -> tuple[Tensor, Tensor]:
    return p.chosen - p.ref_chosen, p.rejected - p.ref_rejected


# --------------------------------------------------------------------------- losses


@_preference_loss("sigmoid", needs_ref=True, needs_lengths=False)
def sigmoid(p: _Pairs, beta: float, label_smoothing: float, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """DPO: loss = -log sigma(beta * h); with label smoothing eps, conservative DPO (cDPO).

    Rafailov et al. 2023, "Direct Preference Optimization", Eq. 7; cDPO: Mitchell 2023, "A note on
    DPO with noisy preferences & relationship to IPO" (each label flipped with probability eps):
        loss = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h),  0 <= eps <= 0.5.
    TRL 1.x: ``DPOTrainer`` ``loss_type="sigmoid"`` (it equals TRL's at eps = 0; TRL 1.x applies no
    label smoothing to sigmoid). Lengths are ignored; ``gamma`` must be 0.

    -> (loss [B], beta (pi_c - ref_c) [B], beta (pi_r - ref_r) [B]).
    """
    chosen, rejected = _log_ratios(p)
    loss = _smoothed_logistic(beta * (chosen - rejected), label_smoothing)
    return loss, beta * chosen.detach(), beta * rejected.detach()


@_preference_loss("robust", needs_ref=True, needs_lengths=False, smoothing_inclusive=False)
def robust(p: _Pairs, beta: float, label_smoothing: float, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """Robust DPO (rDPO): an unbiased estimate of the clean-label DPO loss under label noise eps.

    Chowdhury et al. 2024, "Provably Robust DPO: Aligning Language Models with Noisy Feedback", the
    de-biased ("robust") DPO loss (eps = ``label_smoothing``, the flip probability, 0 <= eps < 0.5):
        loss = ((1 - eps) * -log sigma(beta h) + eps * log sigma(-beta h)) / (1 - 2 eps).
    It can be negative for eps > 0. At eps = 0 it is DPO. TRL: ``DPOTrainer`` ``loss_type="robust"``.
    Lengths are ignored; ``gamma`` must be 0.

    -> (loss [B], beta (pi_c - ref_c) [B], beta (pi_r - ref_r) [B]).
    """
    chosen, rejected = _log_ratios(p)
    z, eps = beta * (chosen - rejected), label_smoothing
    loss = (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)
    return loss, beta * chosen.detach(), beta * rejected.detach()


@_preference_loss("ipo", needs_ref=True, needs_lengths=True, uses_smoothing=False)
def ipo(p: _Pairs, beta: float, label_smoothing: float, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """IPO: squared regression of the (length-averaged) log-ratio margin onto 1 / (2 beta).

    Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", Eq. 17 (beta is the paper's tau). As TRL 1.x ``DPOTrainer`` ``loss_type="ipo"``,
    each log-ratio is divided by its response length (clamped to >= 1) first; TRL's note: the
    IPO authors confirmed their results use this normalised form:
        h_avg = (pi_c - ref_c) / |y_c| - (pi_r - ref_r) / |y_r|,   loss = (h_avg - 1 / (2 beta))^2.
    Needs ``chosen_lengths`` and ``rejected_lengths``; no label smoothing, ``gamma`` must be 0.
    Rewards are not length-averaged (TRL's).

    -> (loss [B], beta (pi_c - ref_c) [B], beta (pi_r - ref_r) [B]).
    """
    chosen, rejected = _log_ratios(p)
    loss = (chosen / p.chosen_len - rejected / p.rejected_len - 1 / (2 * beta)) ** 2
    return loss, beta * chosen.detach(), beta * rejected.detach()


@_preference_loss("simpo", needs_ref=False, needs_lengths=True, uses_gamma=True)
def simpo(p: _Pairs, beta: float, label_smoothing: float, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """SimPO: reference-free, length-normalised logistic loss with a target margin gamma.

    Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward", Eq. 6;
    label smoothing as TRL's (``trl.experimental.cpo.CPOTrainer`` ``loss_type="simpo"``, there
    ``simpo_gamma``; its ``cpo_alpha=0`` is pure SimPO):
        z = beta (pi_c / |y_c| - pi_r / |y_r|) - gamma,
        loss = -(1 - eps) log sigma(z) - eps log sigma(-z),  0 <= eps <= 0.5.
    Needs ``chosen_lengths`` and ``rejected_lengths`` (clamped to >= 1); the reference log-probs
    are ignored (may be None).

    -> (loss [B], beta pi_c / |y_c| [B], beta pi_r / |y_r| [B]).
    """
    chosen, rejected = beta * p.chosen / p.chosen_len, beta * p.rejected / p.rejected_len
    return _smoothed_logistic(chosen - rejected - gamma, label_smoothing), chosen.detach(), rejected.detach()
