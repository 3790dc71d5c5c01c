"""Chunked prefill's attention over key blocks (rlvr/rollout/block_attention.py) against one
scaled_dot_product_attention with the whole causal + padding mask (the plain reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlvr.rollout.block_attention import block_attention


def _reference(q, k, v, q_start, key_valid, visible=None):
    U, H, C, d = q.shape
    E = k.shape[2]
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    qcol = torch.arange(q_start, q_start + C)[:, None]
    kcol = torch.arange(E)[None, :]
    allowed = (kcol <= qcol) & key_valid[:, None, None, :]
    if visible is not None:
        allowed = allowed & visible(0, E)
    allowed = allowed | (kcol == qcol)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("q_start, C, block", [(0, 7, 3), (13, 5, 4), (20, 1, 8), (9, 9, 64)])
def test_blocks_equal_one_masked_attention(heads, kv_heads, q_start, C, block):
    g = torch.Generator().manual_seed(q_start * 31 + C)
    U, d, E = 3, 8, q_start + C
    q = torch.randn(U, heads, C, d, generator=g)
    k, v = torch.randn(U, kv_heads, E, d, generator=g), torch.randn(U, kv_heads, E, d, generator=g)
    key_valid = torch.ones(U, E, dtype=torch.bool)
    key_valid[1, : E // 2] = False  # left padding, up to inside the chunk
    key_valid[2, : E - 1] = False  # only the last column is a real token
    out = block_attention(q, k, v, q_start, key_valid, block)
    torch.testing.assert_close(out, _reference(q, k, v, q_start, key_valid), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()


def test_a_window_restriction_is_applied_per_block():
    g = torch.Generator().manual_seed(0)
    U, H, d, q_start, C = 2, 2, 4, 10, 6
    E = q_start + C
    q, k, v = torch.randn(U, H, C, d, generator=g), torch.randn(U, H, E, d, generator=g), torch.randn(U, H, E, d, generator=g)
    key_valid = torch.ones(U, E, dtype=torch.bool)
    qpos = torch.arange(q_start, E)[None, :, None].expand(U, C, 1)

    def window(b0, b1):  # 2 sinks + the last 3 columns
        kpos = torch.arange(b0, b1)[None, None, :]
        return ((kpos < 2) | (kpos > qpos - 3))[:, None]

    out = block_attention(q, k, v, q_start, key_valid, 4, window)
    torch.testing.assert_close(out, _reference(q, k, v, q_start, key_valid, window), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, _reference(q, k, v, q_start, key_valid), atol=1e-3)
