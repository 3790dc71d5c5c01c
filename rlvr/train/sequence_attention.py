"""Attention for the flat packed layout: the decoder runs on unpadded tokens, attention per sequence.

The training forward (``rlvr.train.packing``, ``flat``) lays every token of a batch out once, in a
single row with no padding (a GRPO group's shared prompt once for the whole group), so every
matrix multiply and elementwise kernel of the decoder runs on exactly the tokens there are. Only
attention needs to know which tokens belong together; it runs here, one sequence at a time:

- ``sequence_attention`` gathers queries, keys and values from the flat row into a padded
  batch of attention rows, runs SDPA on it and gathers each flat slot's output back from the one
  query that computed it. Without shared prompts a row is a sequence (``[B, heads, T, d]``, the
  plain causal flag, no mask tensor: padding follows every real token, so no real token sees it).
  With them, a sequence's row holds only its queries after the shared prompt (its keys still
  start at the prompt) and each group has one more row for the prompt's own queries, under a
  boolean mask: a prompt's attention queries, like the rest of its layers, run once per group
  (on the TRL benchmark's batch 72 rows of 32 queries instead of 64 of 49; attention 19.7 ->
  15.4 ms of the compiled update).
- The backward of the key and value gathers sums the gradient a shared prompt's keys and values
  get from every row that read them, as the unshared forward does. Both gathers have their own
  backward (``_ReadSlots``, ``_TakeOwners``) made of gathers, in a fixed order: autograd's is a
  scatter-add, which inductor compiles to per-element atomic adds (3 ms a layer on the benchmark
  batch: the compiled update ran 1.04x faster without it).
- Against the row layout (rows of a few sequences under a dense block-diagonal 4D mask), the
  decoder's matmuls skip the rows' padding and the extra prompt copies, and attention computes
  per-sequence scores instead of ``rows x width^2`` masked ones.
- It plugs into transformers' attention interface under the name ``ATTENTION``; ``sequence_layout``
  swaps the model's attention implementation to it for one forward and back. The indices travel
  as keyword arguments of the forward (``indices``: ``rlvr_queries``, ``rlvr_keys`` ...), which
  transformers passes to every attention call. A call without them (another thread's forward of
  the same model while the swap is on) runs transformers' own SDPA attention with its own mask,
  unchanged.
- ``supported(model, longest)``: transformers with the attention and mask interfaces, a decoder
  family whose attention is plain scaled-dot-product (``_FAMILIES``), and a sliding window only
  where it cuts nothing or the family passes each layer's window to the attention function
  (``_WINDOWED``: Mistral, Qwen2/3, Phi-3): those layers run under ``rlvr_window_mask`` (a key
  at most ``window - 1`` positions back), built once per forward by ``indices(window=...)``.
  Other models keep the row layout (``packing.window_reason``: never rows under a cutting window).
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
# Families whose attention layers pass their own ``sliding_window`` (None on a global layer) to the
# attention function: a window shorter than the sequences runs here under a window mask.
_WINDOWED = {"mistral", "qwen2", "qwen3", "phi3"}
_ACTIVE = threading.local()  # set while this thread runs a flat forward: its mask function returns None
_REGISTERED: list[bool] = []


def sequence_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       rlvr_queries: torch.Tensor | None = None, rlvr_owner: torch.Tensor | None = None,
                       rlvr_keys: torch.Tensor | None = None, rlvr_key_first: torch.Tensor | None = None,
                       rlvr_key_more: torch.Tensor | None = None, rlvr_key_shared: torch.Tensor | None = None,
                       rlvr_mask: torch.Tensor | None = None, rlvr_window_mask: torch.Tensor | None = None,
                       sliding_window: int | None = None, **kwargs):
    """transformers attention function. query [1, h, N, d], key/value [1, h_kv, N, d] over the
    flat row's N slots; the ``rlvr_*`` arguments are ``indices(slot, real)``'s. Returns
    ([1, N, h, d], None)."""
    if rlvr_queries is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      sliding_window=sliding_window, **kwargs)
    rows, Q = rlvr_queries.shape

    def read(x: torch.Tensor, index: torch.Tensor, first, more, shared) -> torch.Tensor:
        heads, d = x.shape[1], x.shape[3]  # [1, heads, N, d] -> [rows, heads, length, d]
        out = _ReadSlots.apply(x[0].transpose(0, 1), index.reshape(-1), first, more, shared)
        return out.view(rows, index.shape[1], heads, d).transpose(1, 2)

    q = read(query, rlvr_queries, rlvr_owner, None, None)
    k, v = (read(x, rlvr_keys, rlvr_key_first, rlvr_key_more, rlvr_key_shared) for x in (key, value))
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves h / h_kv query heads
        rep = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(rep, dim=1) for x in (k, v))
    if sliding_window is not None and rlvr_window_mask is not None:  # a windowed layer (``window_mask``)
        rlvr_mask = rlvr_window_mask
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=rlvr_mask, is_causal=rlvr_mask is None,
                                                           scale=scaling, dropout_p=dropout)
    h, d = out.shape[1], out.shape[3]
    return _TakeOwners.apply(out.transpose(1, 2).reshape(rows * Q, h, d), rlvr_owner)[None], None


# The gathers' own backward: gathers, not autograd's scatter-add (see the module docstring).

class _ReadSlots(torch.autograd.Function):
    """``x.index_select(0, index)``: each attention position reads its slot. Backward: a slot's
    gradient is its first reader's (``first``) plus, for the S slots read more than once
    (``shared``), the other readers' (``more`` [R, S], ``len(index)`` where fewer). Exact because
    every other reading position (padding, keys no query sees) gets none."""

    @staticmethod
    def forward(ctx, x, index, first, more, shared):
        ctx.save_for_backward(first, more, shared)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        first, more, shared = ctx.saved_tensors
        out = grad.index_select(0, first)
        if shared is not None and shared.numel():
            P, R, S = grad.shape[0], *more.shape
            rows = grad.index_select(0, more.clamp(max=P - 1).reshape(-1)).view(R, S, *grad.shape[1:])
            rows = rows * (more < P).view(R, S, *[1] * (grad.dim() - 1))  # P: no reader there
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


def indices(slot: torch.Tensor, real: torch.Tensor, window: int | None = None) -> dict[str, torch.Tensor]:
    """The forward keyword arguments of ``sequence_attention`` for a flat layout whose sequence
    positions ``[B, T]`` sit at ``slot`` (``real``: not padding; the slots of a shared prompt are
    held by every sequence of its group).

    Attention runs on ``rows`` of queries against ``T`` keys. Without shared prompts a row is a
    sequence, queries are its keys and the causal flag is the mask. With them, a sequence's row
    holds only the queries after its shared prompt (its keys still start at the prompt), and each
    group gets one more row for the prompt's own queries, so a prompt's queries run once per group
    as its other layers do: ``Q = max(longest completion, longest prompt)`` queries a row instead
    of ``T`` (on the benchmark batch 32 instead of 49, 72 rows instead of 64).

    rlvr_queries [rows, Q]  the slot each query reads (slot 0 past a row's end)
    rlvr_owner   [N]        the query position ``row * Q + i`` that computes each slot (exactly one)
    rlvr_keys    [rows, T]  the slot each key reads (slot 0 past a row's end)
    rlvr_key_first, rlvr_key_more, rlvr_key_shared: the keys' readers (``_readers``)
    rlvr_mask    [rows, 1, Q, T] bool, with shared prompts: key j is seen by query i of a row
                 whose queries start at position ``o`` iff ``j <= o + i`` and j is in the row
    rlvr_window_mask [rows, 1, Q, T] bool, with ``window`` (a sliding window, ``window_of``): the
                 same, and ``o + i - j < window``; the layers that pass a ``sliding_window`` use it
                 (queries past a row's end keep the plain mask: no empty softmax row, no NaN)
    """
    B, T = slot.shape
    device = slot.device
    slot = torch.where(real, slot, 0)
    lengths = real.sum(dim=1)
    n = int(slot.max()) + 1
    held = torch.bincount(slot[real], minlength=n)
    prefix = (real & (held[slot] > 1)).sum(dim=1)  # each sequence's shared prompt (leading slots)
    seq = torch.arange(B, device=device)
    first_holder = torch.full((n,), B, dtype=torch.long, device=device)
    first_holder = first_holder.scatter_reduce(0, slot[:, 0], seq, reduce="amin")
    leaders = seq[(prefix > 0) & (first_holder[slot[:, 0]] == seq)]  # one sequence per group
    # Rows: the B sequences (queries after their prompt), then one per group (the prompt's queries).
    start = torch.cat([prefix, torch.zeros_like(leaders)])  # a row's first query position
    count = torch.cat([lengths - prefix, prefix[leaders]])  # its queries
    key_len = torch.cat([lengths, prefix[leaders]])  # its keys
    keys = slot[torch.cat([seq, leaders])]  # [rows, T]
    Q = int(count.max())
    i = torch.arange(Q, device=device)
    asks = i < count[:, None]  # [rows, Q]
    queries = torch.where(asks, keys.gather(1, (start[:, None] + i).clamp(max=T - 1)), 0)
    owner = torch.empty(n, dtype=torch.long, device=device)
    owner[queries[asks]] = torch.arange(asks.numel(), device=device).view_as(asks)[asks]
    j = torch.arange(T, device=device)
    first, more, shared = _readers(keys.reshape(-1), (j < key_len[:, None]).reshape(-1), n)
    out = {"rlvr_queries": queries, "rlvr_owner": owner, "rlvr_keys": keys, "rlvr_key_first": first,
           "rlvr_key_more": more, "rlvr_key_shared": shared}
    if not len(leaders) and window is None:  # the causal flag is the mask: no [rows, Q, T] tensor at all
        return out
    position = (start[:, None] + i)[:, :, None]  # [rows, Q, 1]: each query's position in its sequence
    plain = (j <= position) & (j < key_len[:, None, None])
    if len(leaders):
        out["rlvr_mask"] = plain[:, None]
    if window is not None:
        out["rlvr_window_mask"] = (plain & ((position - j < window) | ~asks[:, :, None]))[:, None]
    return out


def _readers(read: torch.Tensor, real: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Who reads each of ``n`` slots among positions ``read`` (``real`` ones only): the first
    reader ``[n]``, the S slots read more than once ``[S]`` and their other readers ``[R, S]``
    (in position order; ``len(read)`` where fewer than R)."""
    P, device = read.numel(), read.device
    position = torch.arange(P, device=device)
    first = torch.full((n,), P, dtype=torch.long, device=device)
    first = first.scatter_reduce(0, read[real], position[real], reduce="amin")
    others = position[real & (first[read] != position)]
    shared, column = torch.unique(read[others], return_inverse=True)
    column, order = torch.sort(column, stable=True)
    rank = torch.arange(len(column), device=device) - torch.searchsorted(column, column)
    more = torch.full((int(rank.max()) + 1 if len(rank) else 0, len(shared)), P, dtype=torch.long, device=device)
    more[rank, column] = others[order]
    return first, more, shared


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


def window_of(model: torch.nn.Module, longest: int) -> int | None:
    """The model's sliding window when it is shorter than ``longest`` (it cuts), else None."""
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and longest > window:
        return int(window)
    return None


def supported(model: torch.nn.Module, longest: int) -> bool:
    """Whether ``model``'s attention can run per sequence (see the module docstring)."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in _FAMILIES or not getattr(model, "_supports_attention_backend", False):
        return False
    if window_of(model, longest) is not None and model_type not in _WINDOWED:
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
