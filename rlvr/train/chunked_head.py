"""Token log-probs through the LM head in chunks, so a long batch never holds all its logits.

The update needs log pi(y_t) for N policy tokens: N x V logits (V = the vocabulary; 150k for a
Qwen-sized model, so 16k tokens would be 9.6 GB in float32). ``chunked_token_logprobs`` runs the
head and the log-softmax on ``chunk`` tokens at a time, each under non-reentrant activation
checkpointing: the forward keeps only the chunk's hidden states, and the backward recomputes one
chunk's logits at a time. Same values and gradients as the one-shot computation (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def token_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(head(hidden))[i, targets[i]] in float32: hidden [N, H], targets [N] -> [N]."""
    logits = head(hidden).float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def chunked_token_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                           targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """``token_logprobs`` over ``chunk`` tokens at a time (0 or N <= chunk: all at once)."""
    n = hidden.shape[0]
    if chunk <= 0 or n <= chunk:
        return token_logprobs(head, hidden, targets)
    parts = []
    for start in range(0, n, chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        if torch.is_grad_enabled():
            parts.append(checkpoint(token_logprobs, head, h, t, use_reentrant=False))
        else:
            parts.append(token_logprobs(head, h, t))
    return torch.cat(parts)
