"""Attention for the flat packed layout: the decoder runs on unpadded tokens, attention per sequence.

The training forward (``rlvr.train.packing``, ``flat``) lays every token of a batch out once, in a
single row with no padding (a GRPO group's shared prompt once for the whole group), so every
matrix multiply and elementwise kernel of the decoder runs on exactly the tokens there are. Only
attention needs to know which tokens belong together; it runs here, one sequence at a time:

- ``sequence_attention`` gathers each sequence's queries, keys and values from the flat row into
  a right-padded ``[B, heads, T, head_dim]`` batch (a shared prompt's slots are read by every
  sequence of its group), runs SDPA with the plain causal flag (no mask tensor: padding follows
  every real token, so no real token sees it) and gathers each flat slot's output back from one
  sequence that holds it (its *owner*: the first sequence of the group for a shared prompt's slot,
  whose output is the same in every member). The backward of these gathers sums the gradient a
  shared prompt's keys and values get from every sequence that read them, as the unshared
  forward does. Both gathers have their own backward (``_ReadSlots``, ``_TakeOwners``) with no
  scatter-add in it: autograd's is one, which inductor compiles to per-element atomic adds.
- Against the row layout (rows of a few sequences under a dense block-diagonal 4D mask), the
  decoder's matmuls skip the rows' padding and the extra prompt copies, and attention computes
  ``B x T^2`` causal scores instead of ``rows x width^2`` masked ones, with no mask to build.
- It plugs into transformers' attention interface under the name ``ATTENTION``; ``sequence_layout``
  swaps the model's attention implementation to it for one forward and back. The indices travel
  as keyword arguments of the forward (``indices``: ``rlvr_gather``, ``rlvr_owner`` ...), which
  transformers passes to every attention call. A call without them (another thread's forward of the same model
  while the swap is on) runs transformers' own SDPA attention with its own mask, unchanged.
- ``supported(model, longest)``: transformers with the attention and mask interfaces, a decoder
  family whose attention is plain scaled-dot-product (``_FAMILIES``) and no sliding window
  shorter than the longest sequence. Other models keep the row layout.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

ATTENTION = "rlvr_sequences"
# Decoder families whose attention is plain scaled-dot-product attention (no logit soft-capping,
# sinks or per-layer windows beyond ``sliding_window``): the same list as ``packing._PLAIN_HEAD``
# today, kept apart because it says something else.
_FAMILIES = {"llama", "qwen2", "qwen3", "mistral", "phi3", "smollm3", "olmo2"}
_ACTIVE = threading.local()  # set while this thread runs a flat forward: its mask function returns None
_REGISTERED: list[bool] = []


def sequence_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       rlvr_gather: torch.Tensor | None = None, rlvr_owner: torch.Tensor | None = None,
                       rlvr_more: torch.Tensor | None = None, rlvr_shared: torch.Tensor | None = None, **kwargs):
    """transformers attention function. query [1, h, N, d], key/value [1, h_kv, N, d] over the
    flat row's N slots; the ``rlvr_*`` indices are ``indices(slot, real)``'s. Returns
    ([1, N, h, d], None)."""
    if rlvr_gather is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    B, T = rlvr_gather.shape
    index = rlvr_gather.reshape(-1)

    def per_sequence(x: torch.Tensor) -> torch.Tensor:  # [1, heads, N, d] -> [B, heads, T, d]
        heads, d = x.shape[1], x.shape[3]
        rows = _ReadSlots.apply(x[0].transpose(0, 1), index, rlvr_owner, rlvr_more, rlvr_shared)
        return rows.view(B, T, heads, d).transpose(1, 2)

    q, k, v = per_sequence(query), per_sequence(key), per_sequence(value)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves h / h_kv query heads
        rep = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(rep, dim=1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, dropout_p=dropout)
    h, d = out.shape[1], out.shape[3]
    return _TakeOwners.apply(out.transpose(1, 2).reshape(B * T, h, d), rlvr_owner)[None], None


# The gathers' backward, written without a scatter-add: autograd's ``index_select`` backward is
# ``index_add``, which inductor compiles to per-element atomic adds (3 ms a layer on the
# benchmark batch, 2-3% of the update) and which adds repeats in thread order.

class _ReadSlots(torch.autograd.Function):
    """``x.index_select(0, index)``: each sequence position reads its slot. Backward: a slot's
    gradient is its owner's (``owner``) plus, for the S slots read by several sequences
    (``shared``), the other readers' (``more`` [R, S], P = ``len(index)`` where fewer). Exact
    because every other reading position, padding and the non-owners of a query, gets none."""

    @staticmethod
    def forward(ctx, x, index, owner, more, shared):
        ctx.save_for_backward(owner, more, shared)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        owner, more, shared = ctx.saved_tensors
        out = grad.index_select(0, owner)
        if shared.numel():
            rows = grad.index_select(0, more.clamp(max=grad.shape[0] - 1).reshape(-1))
            rows = rows.view(*more.shape, *grad.shape[1:]) * (more < grad.shape[0]).view(*more.shape, *[1] * (grad.dim() - 1))
            out.index_add_(0, shared, rows.sum(0))  # distinct slots: no two adds meet
        return out, None, None, None, None


class _TakeOwners(torch.autograd.Function):
    """``y.index_select(0, owner)``: each slot takes its owner's output. Backward: the owners'
    positions get the slots' gradients, every other position none (distinct positions: a copy)."""

    @staticmethod
    def forward(ctx, y, owner):
        ctx.save_for_backward(owner)
        ctx.rows = y.shape[0]
        return y.index_select(0, owner)

    @staticmethod
    def backward(ctx, grad):
        owner, = ctx.saved_tensors
        return grad.new_zeros((ctx.rows, *grad.shape[1:])).index_copy(0, owner, grad), None


def indices(slot: torch.Tensor, real: torch.Tensor) -> dict[str, torch.Tensor]:
    """The forward keyword arguments of ``sequence_attention`` for a flat layout whose sequence
    positions ``[B, T]`` sit at ``slot`` (``real``: not padding; a shared prompt's slot is held by
    every sequence of its group). Flat positions ``p = b * T + t``; ``P = B * T`` is "none".

    rlvr_gather [B, T]  the slot each position reads (slot 0 on padding, which no real token sees)
    rlvr_owner  [N]     the lowest position holding each slot: the output it takes (a shared
                        prompt's outputs are the same in every member)
    rlvr_shared [S]     the slots held by several sequences (a shared prompt's)
    rlvr_more   [R, S]  the positions other than the owner holding each of them (P where fewer
                        than R): the backward sums their key and value gradients into the slot
    """
    B, T = slot.shape
    P, device = B * T, slot.device
    position = torch.arange(P, device=device)
    flat_slot, flat_real = slot.reshape(-1), real.reshape(-1)
    owner = torch.full((int(slot.max()) + 1,), P, dtype=torch.long, device=device)
    owner = owner.scatter_reduce(0, flat_slot[flat_real], position[flat_real], reduce="amin")
    gather = torch.where(flat_real, flat_slot, 0)
    others = position[flat_real & (owner[gather] != position)]  # ascending: a slot's readers in order
    shared, column = torch.unique(gather[others], return_inverse=True)
    column, order = torch.sort(column, stable=True)
    rank = torch.arange(len(column), device=device) - torch.searchsorted(column, column)
    more = torch.full((int(rank.max()) + 1 if len(rank) else 0, len(shared)), P, dtype=torch.long, device=device)
    more[rank, column] = others[order]
    return {"rlvr_gather": gather.view(B, T), "rlvr_owner": owner, "rlvr_more": more, "rlvr_shared": shared}


def _mask(*args, **kwargs):
    """Mask function under ``ATTENTION``: none inside a flat forward, transformers' SDPA mask else."""
    if getattr(_ACTIVE, "on", False):
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def _register() -> bool:
    """Register ``ATTENTION`` with transformers once; False when this transformers lacks the
    attention or mask interface (then the row layout is used)."""
    if not _REGISTERED:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface
        except ImportError:
            _REGISTERED.append(False)
        else:
            AttentionInterface.register(ATTENTION, sequence_attention)
            AttentionMaskInterface.register(ATTENTION, _mask)
            _REGISTERED.append(True)
    return _REGISTERED[0]


def supported(model: torch.nn.Module, longest: int) -> bool:
    """Whether ``model``'s attention can run per sequence (see the module docstring)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in _FAMILIES or not getattr(model, "_supports_attention_backend", False):
        return False
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and longest > window:
        return False
    return _register()


@contextlib.contextmanager
def sequence_layout(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model``'s attention as ``ATTENTION`` inside the context (call ``supported`` first)."""
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = ATTENTION
    _ACTIVE.on = True
    try:
        yield
    finally:
        _ACTIVE.on = False
        cfg._attn_implementation = before
