"""The next token from logits: greedy, temperature and top-p, drawn by inverse-CDF sampling (one
uniform per row; why not ``torch.multinomial``: docs/rollout.md, "Sampling"), and the recorded
log-probability of the token under the plain policy."""

from __future__ import annotations

import torch


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the nucleus: the smallest set of most likely tokens whose
    probability reaches ``top_p`` (the most likely token is always kept). ``logits``: [B, V]."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # mass strictly before each token: a token is in the nucleus if that mass is still < top_p
    before = probs.cumsum(dim=-1) - probs
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row from float32 logits [B, V] -> [B]; ``temperature`` 0 is greedy. A token
    of probability 0 is never picked: its CDF step is empty. The uniforms come from
    ``generator``'s device (a CPU generator also drives a GPU engine)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits if temperature == 1 else logits / temperature
    scaled = top_p_filter(scaled, top_p)
    cdf = scaled.softmax(dim=-1).cumsum(dim=-1)
    at = generator.device if generator is not None else cdf.device
    u = torch.rand((cdf.shape[0], 1), generator=generator, device=at, dtype=cdf.dtype)
    if u.device != cdf.device:  # pinned, so the copy to the GPU does not wait for the GPU to drain
        u = u.pin_memory().to(cdf.device, non_blocking=True) if cdf.device.type == "cuda" else u.to(cdf.device)
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def token_logprob(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[token]`` per row: the token's log-probability at temperature 1
    without top-p, whatever it was sampled with. [B, V], [B] -> [B]."""
    return logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
