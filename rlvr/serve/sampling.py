"""Per-row sampling for a batch whose rows belong to different requests.

Each row has its own temperature, top-p and random stream (a ``torch.Generator`` per request), so
a request's tokens do not depend on what else is in the batch: greedy rows take the argmax, the
others draw one uniform from their own generator and invert the CDF of their temperature-scaled,
top-p-filtered softmax (as ``rollout/sampling.py`` does for a whole batch with one setting).
Identical up to float error in the logits, which batch shapes can change in the last bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from rlvr.rollout.sampling import token_logprob


def request_generator(*key: object) -> torch.Generator:
    """A CPU generator for one request's stream, seeded from a hash of ``key`` (so nearby seeds
    give unrelated streams)."""
    digest = hashlib.sha256("/".join(map(str, ("rlvr.serve", *key))).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def sample_rows(logits: torch.Tensor, temperature: Sequence[float], top_p: Sequence[float],
                generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row of float32 ``logits`` [B, V] and its log-prob under the plain policy
    (temperature 1, no top-p): ([B] long, [B] float32)."""
    tokens = logits.argmax(dim=-1)
    hot = [i for i, t in enumerate(temperature) if t > 0]
    if hot:
        dev = logits.device
        idx = torch.tensor(hot, device=dev)
        temp = torch.tensor([temperature[i] for i in hot], device=dev, dtype=logits.dtype)[:, None]
        scaled = logits.index_select(0, idx) / temp
        p = torch.tensor([top_p[i] for i in hot], device=dev, dtype=logits.dtype)[:, None]
        if bool((p < 1).any()):
            sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            drop_sorted = (probs.cumsum(dim=-1) - probs) >= p  # mass before the token reaches top_p
            scaled = scaled.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
        cdf = scaled.softmax(dim=-1).cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=generators[i], dtype=cdf.dtype) for i in hot]).to(dev)[:, None]
        drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
        tokens = tokens.index_copy(0, idx, drawn)
    return tokens, token_logprob(logits, tokens)


def top_logprobs(logits: torch.Tensor, k: Sequence[int]) -> list[tuple[tuple[int, float], ...]]:
    """Per row of ``logits`` [B, V], its ``k[row]`` most likely ``(token id, log-prob)`` under the
    plain policy (temperature 1, no top-p), most likely first; ``()`` where ``k`` is 0. One
    log-softmax and one top-k over the rows that ask."""
    out: list[tuple[tuple[int, float], ...]] = [()] * len(k)
    asking = [i for i, n in enumerate(k) if n > 0]
    if not asking:
        return out
    idx = torch.tensor(asking, device=logits.device)
    values, ids = logits.index_select(0, idx).float().log_softmax(dim=-1).topk(max(k[i] for i in asking), dim=-1)
    for row, i in enumerate(asking):
        out[i] = tuple(zip(ids[row, :k[i]].tolist(), values[row, :k[i]].tolist()))
    return out
