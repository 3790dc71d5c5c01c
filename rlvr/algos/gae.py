"""PPO with a learned critic: token rewards, GAE, the clipped value loss, advantage whitening.

Timesteps are the *policy tokens* of a sequence (``mask[b, t] == 1``), in order. A multi-turn
episode interleaves environment tokens (tool output, user turns) with the policy's: those are
not actions, so they are skipped, and the next policy token is the next timestep. The value after
the last policy token is 0 (the episode is over). Tensors are aligned with ``Batch.input_ids``
(``values[b, t]`` is the critic's value of the state in which token t is chosen, the same
alignment as ``logprobs[b, t]`` and ``loss_mask[b, t]``). Off-mask positions of every output
are 0, whatever the inputs hold there (nan, inf).

No model calls, no config objects: ``rlvr.train.critic`` runs the value model and the trainer
passes plain values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos.advantages import ADVANTAGES


def _on(mask: Tensor) -> Tensor:
    return mask > 0


def outcome_token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None = None, beta: float = 0.0) -> Tensor:
    """Per-token rewards of an outcome-rewarded sequence, optionally with the KL penalty in them.

    r_t = [t = last policy token] * r  -  beta * kl_t   (at policy tokens; 0 elsewhere)

    The KL-in-reward form of InstructGPT (Ouyang et al. 2022, Eq. 2: R(x, y) - beta log(pi/pi_ref))
    spread over tokens as OpenRLHF's ``compute_reward`` does: the per-token KL estimate ``kl``
    ([B,T], any estimator) at every policy token, the outcome reward at the last one. A sequence
    with no policy token gets all zeros (its reward has nowhere to go).

    rewards [B], mask [B,T], kl [B,T] or None -> token rewards [B,T] (dtype of rewards).
    """
    on = _on(mask)
    t = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(on, t, torch.full_like(t, -1)).amax(dim=1)  # -1: no policy token
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = rewards[rows]
    if kl is not None and beta:
        out = out - beta * torch.where(on, kl.to(out.dtype), torch.zeros_like(out))
    return out


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the policy tokens of each sequence.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", Eq. 16 (with the TD residual of Eq. 10), over timesteps k = the policy tokens:
        delta_k = r_k + gamma * V_{k+1} - V_k          (V after the last policy token = 0)
        A_k     = sum_{l >= 0} (gamma * lam)^l * delta_{k+l}
        R_k     = A_k + V_k                             (the critic's regression target, TD(lambda))
    Computed by the recursion A_k = delta_k + gamma * lam * A_{k+1} as one reverse scan, vectorised
    over the batch, on compacted rows: each row's policy tokens gathered to its front in order
    (environment tokens and the prompt leave the scan, so the next policy token is the next
    timestep), the scan over the longest row's policy-token count, the results scattered back.
    gamma = lam = 1 gives A_k = (sum of rewards from k on) - V_k.

    token_rewards [B,T], values [B,T], mask [B,T] -> (advantages [B,T], returns [B,T]), 0 off mask.
    """
    on = _on(mask)
    zeros = torch.zeros_like(token_rewards)
    r = torch.where(on, token_rewards, zeros)
    v = torch.where(on, values.to(r.dtype), zeros)
    length = int(on.sum(dim=1).max()) if on.numel() else 0
    # stable sort of "off" flags: each row's policy positions first, in their original order
    order = torch.sort((~on).to(torch.int8), dim=1, stable=True).indices[:, :length]
    r_c, v_c, on_c = r.gather(1, order), v.gather(1, order), on.gather(1, order)
    adv_c = torch.zeros_like(r_c)
    next_value = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    next_adv = torch.zeros_like(next_value)
    for k in range(length - 1, -1, -1):  # past a row's last policy token: V = A = 0 (terminal)
        delta = r_c[:, k] + gamma * next_value - v_c[:, k]
        next_adv = torch.where(on_c[:, k], delta + gamma * lam * next_adv, next_adv)
        next_value = torch.where(on_c[:, k], v_c[:, k], next_value)
        adv_c[:, k] = torch.where(on_c[:, k], next_adv, zeros[:, 0])
    adv = zeros.scatter(1, order, adv_c)
    returns = torch.where(on, adv + v, zeros)
    return adv, returns


def whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps) over the policy tokens of the whole batch; 0 off the mask.

    PPO's advantage normalisation (OpenAI baselines ``ppo2``, "normalize advantages"; OpenRLHF
    and TRL ``masked_whiten``). The std is the population std of the masked values. With
    ``shift_mean=False`` the mean is added back (scale only). An empty mask returns zeros.

    x [B,T], mask [B,T] -> [B,T].
    """
    on = _on(mask)
    zeros = torch.zeros_like(x)
    if not bool(on.any()):
        return zeros
    vals = x[on]
    mean = vals.mean()
    std = ((vals - mean) ** 2).mean().sqrt()
    out = (x - mean) / (std + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(on, out, zeros)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss, averaged over policy tokens.

    PPO as implemented in OpenAI baselines ``ppo2`` (and OpenRLHF's ``ValueLoss``):
        V_clip = V_old + clip(V - V_old, -c, c)
        loss_t = 0.5 * max((V - R)^2, (V_clip - R)^2)
    ``clip`` <= 0 turns clipping off (loss_t = 0.5 (V - R)^2). The sum over policy tokens is divided
    by ``num_tokens`` (default: this batch's count, at least 1), so micro-batches given the whole
    mini-batch's count sum to the mini-batch loss. Off-mask positions contribute no loss, gradient or
    metric, whatever they hold.

    values [B,T] (requires grad), old_values [B,T], returns [B,T], mask [B,T] ->
    (scalar loss, metrics): ``value_clip_frac`` (share of tokens where the clipped term is the larger
    one), ``value_mean``, ``value_error`` (mean (V - R)^2, no clipping).
    """
    on = _on(mask)
    zeros = torch.zeros_like(values)
    v = torch.where(on, values, zeros)
    old = torch.where(on, old_values.to(v.dtype), zeros)
    ret = torch.where(on, returns.to(v.dtype), zeros)
    unclipped = (v - ret) ** 2
    if clip > 0:
        clipped = (old + (v - old).clamp(-clip, clip) - ret) ** 2
        token_loss = 0.5 * torch.maximum(unclipped, clipped)
    else:
        clipped = unclipped
        token_loss = 0.5 * unclipped
    m = on.to(v.dtype)
    count = float(m.sum())
    loss = (token_loss * m).sum() / (num_tokens if num_tokens is not None else max(count, 1.0))
    with torch.no_grad():
        denom = max(count, 1.0)
        metrics = {
            "value_clip_frac": float(((clipped > unclipped).to(m.dtype) * m).sum() / denom),
            "value_mean": float((v * m).sum() / denom),
            "value_error": float((unclipped * m).sum() / denom),
        }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over policy tokens (OpenAI baselines ``explained_variance``): 1 is a
    perfect critic, 0 no better than a constant, negative worse. nan when Var[R] is 0 or the mask is
    empty (undefined, as in baselines)."""
    on = _on(mask)
    if not bool(on.any()):
        return float("nan")
    r, v = returns[on].double(), values[on].double()
    var = r.var(unbiased=False)
    return float("nan") if var == 0 else float(1 - (r - v).var(unbiased=False) / var)


@ADVANTAGES.register("gae")
def gae_advantages(rewards: Tensor, group_ids: Tensor | None = None, *, values: Tensor, mask: Tensor, gamma: float,
                   lam: float, whiten_advantages: bool = True, kl: Tensor | None = None, beta: float = 0.0,
                   eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """``ADVANTAGES["gae"]`` (``NEEDS_VALUES``): (token advantages [B, T], returns [B, T]) of
    outcome ``rewards`` [B] by GAE over the critic's ``values`` [B, T] (``outcome_token_rewards``
    with the KL penalty ``beta * kl`` when given, then ``gae``); the advantages whitened over the
    batch's policy tokens when ``whiten_advantages``, the returns (the critic's targets) never.
    ``group_ids`` and ``eps`` are unused: the critic is the baseline."""
    token_rewards = outcome_token_rewards(rewards.to(values.dtype), mask, kl, beta)
    adv, returns = gae(token_rewards, values, mask, gamma=gamma, lam=lam)
    return (whiten(adv, mask) if whiten_advantages else adv), returns
