"""Attention of a prefill chunk over key blocks, softmax merged block by block (chunked prefill).

A chunk of ``C`` queries attends to every key before its end: with one explicit mask that is a
``[C, keys]`` mask and, on CPU, ``[heads, C, keys]`` float scores, so a chunk's memory grows with
the prompt (measured: 588 MB at 32k tokens against 348 at 16k for a 2-layer model). Here the keys
are taken ``block`` at a time and each query's softmax is accumulated with a running maximum and
sum (the online softmax of FlashAttention, Dao et al. 2022): nothing larger than
``[rows, heads, C, block]`` is ever made, whatever the prompt length.

``block_attention(q, k, v, q_start, key_valid, block)``: causal (query column ``q_start + i``
sees key columns up to itself), keys only where ``key_valid`` (left padding), and a query always
sees itself (a padding query then has a defined, unused output, as the unchunked prefill's mask
gives it). Grouped-query attention: ``k``/``v`` have ``heads / rep`` heads, repeated per block.
Equal to one ``scaled_dot_product_attention`` with the full mask up to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, key_valid: torch.Tensor,
                    block: int, visible: Callable[[int, int], torch.Tensor] | None = None) -> torch.Tensor:
    """q [U, H, C, d] (query columns ``q_start .. q_start + C - 1``), k/v [U, Hkv, E, d] (key
    columns ``0 .. E - 1``, E = q_start + C), key_valid [U, E] bool -> [U, H, C, d].
    ``visible(b0, b1)``: a further restriction of the queries to key columns ``b0 .. b1 - 1``
    ([U, 1, C, b1 - b0] bool; the sliding window of ``kv_cache="sink_window"``), or None."""
    U, H, C, d = q.shape
    rep = H // k.shape[1]
    E = k.shape[2]
    scale = d ** -0.5
    dev = q.device
    qcol = torch.arange(q_start, q_start + C, device=dev)[:, None]  # [C, 1]
    m = torch.full((U, H, C, 1), float("-inf"), dtype=torch.float32, device=dev)
    total = torch.zeros((U, H, C, 1), dtype=torch.float32, device=dev)
    acc = torch.zeros((U, H, C, d), dtype=torch.float32, device=dev)
    for b0 in range(0, E, block):
        b1 = min(b0 + block, E)
        kb, vb = k[:, :, b0:b1], v[:, :, b0:b1]
        if rep > 1:
            kb, vb = kb.repeat_interleave(rep, dim=1), vb.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, kb.transpose(-1, -2)).float() * scale  # [U, H, C, B]
        kcol = torch.arange(b0, b1, device=dev)[None, :]
        allowed = (kcol <= qcol) & key_valid[:, None, None, b0:b1]  # [U, 1, C, B]
        if visible is not None:
            allowed = allowed & visible(b0, b1)
        allowed = allowed | (kcol == qcol)
        s = s.masked_fill(~allowed, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows with no key yet: no NaN
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe)
        total = total * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + torch.matmul(p.to(vb.dtype), vb).float()
        m = m_new
    return (acc / total).to(q.dtype)
