"""Attention of a prefill chunk over key blocks, softmax merged block by block (chunked prefill).

A chunk of ``C`` queries attends to every key before its end: with one explicit mask that is a
``[C, keys]`` mask and, on CPU, ``[heads, C, keys]`` float scores, so a chunk's memory grows with
the prompt (measured: 588 MB at 32k tokens against 348 at 16k for a 2-layer model). Here the keys
are taken ``block`` at a time and each query's softmax is accumulated with a running maximum and
sum (the online softmax of FlashAttention, Dao et al. 2022): nothing larger than
``[rows, heads, C, block]`` is ever made, whatever the prompt length.

The keys come from a loader, ``load(i0, i1) -> (k, v)`` for keys ``i0 .. i1 - 1``, so a cache can
hand them out in its own storage: a whole-width buffer (``dense``), a kept subset of columns
(``kv_cache="sink_window"``: ``key_cols`` gives each key's column), or int8 columns dequantised
block by block (``kv_cache="int8"``). Causal by column (query column ``q_start + i`` sees key
columns up to itself), keys only where ``key_valid`` (left padding), and a query always sees itself
(a padding query then has a defined, unused output, as the unchunked prefill's mask gives it).
Grouped-query attention: the keys have ``heads / rep`` heads, repeated per block. Equal to one
``scaled_dot_product_attention`` with the full mask up to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Loader = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def dense(k: torch.Tensor, v: torch.Tensor) -> Loader:
    """The loader of keys held in one tensor pair [U, Hkv, E, d]."""
    return lambda i0, i1: (k[:, :, i0:i1], v[:, :, i0:i1])


def block_attention(q: torch.Tensor, load: Loader, n_keys: int, q_start: int, key_valid: torch.Tensor, block: int,
                    visible: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    key_cols: torch.Tensor | None = None) -> torch.Tensor:
    """q [U, H, C, d] (query columns ``q_start .. q_start + C - 1``) over ``n_keys`` keys from
    ``load`` ([U, Hkv, i1 - i0, d] each) at columns ``key_cols`` ([n_keys] long, ascending; None:
    key i is column i), key_valid [U, n_keys] bool -> [U, H, C, d]. ``visible(cols)``: a further
    restriction of the queries to the keys at columns ``cols`` ([U, 1, C, len(cols)] bool; the
    sliding window of ``kv_cache="sink_window"``), or None."""
    U, H, C, d = q.shape
    scale = d ** -0.5
    dev = q.device
    qcol = torch.arange(q_start, q_start + C, device=dev)[:, None]  # [C, 1]
    m = torch.full((U, H, C, 1), float("-inf"), dtype=torch.float32, device=dev)
    total = torch.zeros((U, H, C, 1), dtype=torch.float32, device=dev)
    acc = torch.zeros((U, H, C, d), dtype=torch.float32, device=dev)
    for i0 in range(0, n_keys, block):
        i1 = min(i0 + block, n_keys)
        kb, vb = load(i0, i1)
        rep = H // kb.shape[1]
        if rep > 1:
            kb, vb = kb.repeat_interleave(rep, dim=1), vb.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, kb.transpose(-1, -2)).float() * scale  # [U, H, C, B]
        kcol = (torch.arange(i0, i1, device=dev) if key_cols is None else key_cols[i0:i1])[None, :]
        allowed = (kcol <= qcol) & key_valid[:, None, None, i0:i1]  # [U, 1, C, B]
        if visible is not None:
            allowed = allowed & visible(kcol[0])
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
