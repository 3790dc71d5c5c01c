"""Reward shaping and loss weights that correct for how samples were produced.

- ``overlong_penalty``: DAPO's soft punishment for responses near or past the length limit,
  added to the reward of each sample (``reward.overlong=soft`` in ``rlvr/rewards.py``).
- ``truncated_is_weights``: per-token importance weights for off-policy (asynchronous) rollouts,
  passed to the policy loss as ``is_weights``.

Pure tensor functions; this module does not decide whether a sample was truncated (that is the
trajectory's ``finish_reason``). These change a truncated sample's reward (this soft penalty, or
the fixed penalty of ``reward.overlong=truncated`` in ``rlvr/rewards.py``) and keep it in the loss;
DAPO's overlong filtering, which takes truncated samples out of the loss instead, is the trainer's
``algo.overlong_filter`` (``rlvr.train.grpo.drop_overlong``: rows leave the batch, no math here).
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, *, max_tokens: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, Eq. 13), scaled by ``penalty``:

        0                                         if L <= max_tokens - buffer
        ((max_tokens - buffer) - L) / buffer * p  if max_tokens - buffer < L <= max_tokens
        -p                                        if L > max_tokens

    ``buffer`` = 0 gives the hard step (0 up to max_tokens, -p beyond).

    lengths [N] (int or float, response tokens) -> penalties [N] float32 (or lengths' float dtype).
    """
    if not 0 <= buffer <= max_tokens:
        raise ValueError(f"need 0 <= buffer <= max_tokens, got buffer={buffer}, max_tokens={max_tokens}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    lengths = lengths.to(dtype)
    start = max_tokens - buffer
    ramp = (start - lengths) / max(buffer, 1) * penalty
    out = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_tokens, torch.full_like(lengths, -penalty), out)


def truncated_is_weights(old_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance weights min(pi_old / pi_behaviour, cap), per token.

    For asynchronous RL where the rollout ("behaviour") policy lags the trainer's pi_old:
    truncated IS as in IMPALA/V-trace (Espeholt et al. 2018) and "Your efficient RL framework
    secretly brings you off-policy RL training" (Yao et al. 2025, TIS). The weights carry no
    gradient. Positions where both log-probs are 0 (off the loss mask) get weight 1.

    old_logprobs [B,T], behaviour_logprobs [B,T] -> weights [B,T] in (0, cap].
    """
    if cap <= 0:
        raise ValueError(f"cap must be positive, got {cap}")
    # exp may overflow to inf for a wildly stale token; clamp(max=cap) turns that into cap.
    return (old_logprobs - behaviour_logprobs).detach().exp().clamp(max=cap)
