"""Per-token log-probs of given sequences under a model: the training forward's log-probs (with
gradients), the weight-sync canary and the rollout engine's parity check. Below both
``rlvr.rollout`` and ``rlvr.train``."""

from __future__ import annotations

import torch

from rlvr.algos.losses import token_logprobs


def sequence_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token given the tokens before it: [B, T] -> [B, T] float32.

    Inputs are right-padded. Position 0 and padded positions get 0.0. Gradients flow when called
    outside ``inference_mode``/``no_grad`` (the trainer's use). The logits are taken in float32
    (also from a bf16 model or under autocast), so ``token_logprobs`` computes
    ``logit[y] - logsumexp(logits)``: no [B, T, V] log-softmax tensor is kept besides the logits.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.float()
    lp = token_logprobs(logits, input_ids)
    return lp * attention_mask.to(lp.dtype)
