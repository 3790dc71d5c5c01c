"""Chunked prefill's attention over key blocks (rlvr/rollout/block_attention.py) against one
scaled_dot_product_attention with the whole causal + padding mask (the plain reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlvr.rollout.block_attention import block_attention, dense


def _reference(q, k, v, q_start, key_valid, visible=None):
    U, H, C, d = q.shape
    E = k.shape[2]
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    qcol = torch.arange(q_start, q_start + C)[:, None]
    kcol = torch.arange(E)[None, :]
    allowed = (kcol <= qcol) & key_valid[:, None, None, :]
    if visible is not None:
        allowed = allowed & visible(torch.arange(E))
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
    out = block_attention(q, dense(k, v), E, q_start, key_valid, block)
    torch.testing.assert_close(out, _reference(q, k, v, q_start, key_valid), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()


def test_a_window_restriction_is_applied_per_block():
    g = torch.Generator().manual_seed(0)
    U, H, d, q_start, C = 2, 2, 4, 10, 6
    E = q_start + C
    q, k, v = torch.randn(U, H, C, d, generator=g), torch.randn(U, H, E, d, generator=g), torch.randn(U, H, E, d, generator=g)
    key_valid = torch.ones(U, E, dtype=torch.bool)
    qpos = torch.arange(q_start, E)[None, :, None].expand(U, C, 1)

    def window(cols):  # 2 sinks + the last 3 columns
        kpos = cols[None, None, :]
        return ((kpos < 2) | (kpos > qpos - 3))[:, None]

    out = block_attention(q, dense(k, v), E, q_start, key_valid, 4, window)
    torch.testing.assert_close(out, _reference(q, k, v, q_start, key_valid, window), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, _reference(q, k, v, q_start, key_valid), atol=1e-3)


def test_a_subset_of_columns_equals_the_whole_width_when_the_rest_is_invisible():
    """What sink_window's chunked prefill keeps (sinks and the recent window, ``key_cols``) gives
    the whole-width attention under the same window, and a loader may split keys across storages."""
    g = torch.Generator().manual_seed(3)
    U, H, Hkv, d, q_start, C = 2, 4, 2, 8, 30, 5
    E = q_start + C
    q = torch.randn(U, H, C, d, generator=g)
    k, v = torch.randn(U, Hkv, E, d, generator=g), torch.randn(U, Hkv, E, d, generator=g)
    key_valid = torch.ones(U, E, dtype=torch.bool)
    key_valid[1, :3] = False
    qpos = torch.arange(q_start, E)[None, :, None]

    def window(cols):  # columns 3..4 are row 0's sinks, the window is 6 columns
        kpos = cols[None, None, :]
        return ((kpos < 5) | (kpos > qpos - 6))[:, None].expand(U, 1, C, len(cols))

    cols = torch.tensor([0, 1, 2, 3, 4, *range(q_start - 5, E)])
    ks, vs = k[:, :, cols], v[:, :, cols]
    half = 4  # keys < 4 from one tensor pair, the rest from another, as int8 + tail does

    def load(i0, i1):
        parts = [(ks[:, :, :half], vs[:, :, :half]), (ks[:, :, half:], vs[:, :, half:])]
        kk = torch.cat([parts[0][0], parts[1][0]], 2)[:, :, i0:i1]
        return kk, torch.cat([parts[0][1], parts[1][1]], 2)[:, :, i0:i1]

    out = block_attention(q, load, len(cols), q_start, key_valid[:, cols], 3, window, key_cols=cols)
    torch.testing.assert_close(out, _reference(q, k, v, q_start, key_valid, window), atol=1e-5, rtol=1e-5)
