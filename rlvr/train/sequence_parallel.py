"""Sequence parallelism (DeepSpeed-Ulysses): one long sequence split across the ranks of a process
group, so a sequence too long for one process trains on several (docs/distributed.md, "Sequence
parallelism"). Outputs and gradients equal the single-process ones (float rounding aside).

Layout. Each of the P ranks holds ``T / P`` consecutive tokens of the sequence (``shard_sequence``
pads ``T`` to a multiple of P; the padding is ignored by the loss and, sitting after every real
token under a causal mask, is seen by none). Every layer but attention is per token, so it runs on
the rank's tokens alone. Attention needs every earlier token; before it, one ``all_to_all_single``
per tensor redistributes queries, keys and values from the token split to a head split (each rank
then holds all ``T`` tokens for ``H / P`` query heads and ``H_kv / P`` key/value heads), the rank
runs ordinary causal attention on its heads, and a second ``all_to_all_single`` brings the output
back to the token split. The backward of each exchange is the inverse exchange (``_AllToAll``).
Grouped-query attention needs ``H_kv`` divisible by P (``check_heads`` says which counts do not
fit). RoPE positions are each token's global offset (``Shard.position_ids``).

Plugging in. The attention is registered in transformers' attention interface under
``ATTENTION`` (with a mask function that builds no mask: the attention is causal by itself), and
``sequence_parallel(model, group)`` switches ``model.config._attn_implementation`` to it for the
forwards inside the context and back, as ``rlvr.train.sequence_attention.sequence_layout`` does.
A call of the attention outside the context (another thread's forward) runs transformers' own
SDPA attention unchanged. Families: decoders whose attention is plain causal scaled-dot-product
attention (Llama, Qwen2/3, Mistral ... without a sliding window shorter than the sequence).

Loss and gradients. ``sequence_loss`` runs the sharded forward and returns the mean token loss
over the whole sequence, equal on every rank: each rank sums its own tokens' loss, the sum over
the ranks is an all-reduce whose backward passes the gradient through unchanged (``_SumOverRanks``),
and the mean divides by the number of target tokens of the whole sequence. Calling ``backward`` on
every rank and then ``reduce_gradients`` (the sum of the ranks' parameter gradients, as data
parallel does) gives every rank the single-process gradient of the mean loss: a rank's parameter
gradient holds the part of the loss that flowed through its own tokens' computation (the
all-to-all backward brings the other ranks' share of its keys and values back to it).

Requires a torch.distributed process group (gloo on CPU, tested; nccl untested) and transformers
with ``AttentionInterface`` and ``AttentionMaskInterface``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

ATTENTION = "rlvr_ulysses"
IGNORE = -100
_STATE = threading.local()  # .group: the process group of this thread's sequence-parallel forward
_REGISTERED: list[bool] = []


def _world(group) -> int:
    return dist.get_world_size(group)


def _rank(group) -> int:
    return dist.get_rank(group)


# ---------------------------------------------------------------------------------------------
# Exchanges


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` into P equal chunks along ``scatter_dim``, send chunk j to rank j, and
    concatenate the chunks received (in rank order) along ``gather_dim``."""
    P = _world(group)
    send = torch.stack(x.chunk(P, dim=scatter_dim)).contiguous()  # [P, *chunk]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """``_exchange`` with its inverse as the backward."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group), None, None, None


class _SumOverRanks(torch.autograd.Function):
    """The sum of ``x`` over the ranks (equal on every rank). Backward: the gradient unchanged,
    since each rank back-propagates its own copy of the same total: the total's gradient with
    respect to this rank's term is that of the total."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# ---------------------------------------------------------------------------------------------
# Sharding


@dataclass
class Shard:
    """This rank's slice of a batch of sequences ``[B, T]`` split along the sequence."""

    input_ids: torch.Tensor
    """[B, T_pad / P]: the rank's consecutive tokens (``pad_id`` past the sequence's end)."""
    position_ids: torch.Tensor
    """[B, T_pad / P]: their global positions (the rank's offset onward), for RoPE."""
    next_ids: torch.Tensor
    """[B, T_pad / P]: the token after each position (``pad_id`` from the last token on)."""
    targets: torch.Tensor
    """[B, T_pad / P]: the next token each position is trained to predict, ``IGNORE`` where the
    loss skips it (the last token, padding, and every position whose label is ``IGNORE``)."""
    start: int
    """The global position of the rank's first token."""
    length: int
    """The unpadded sequence length ``T``."""
    padded: int
    """``T_pad``: ``T`` rounded up to a multiple of the world size."""


def shard_sequence(input_ids: torch.Tensor, group=None, labels: torch.Tensor | None = None,
                   pad_id: int = 0) -> Shard:
    """This rank's share of ``input_ids`` [B, T] (every rank passes the same tensor): the
    sequence padded to a multiple of the group's size and cut into equal consecutive slices.
    ``labels`` [B, T] follows transformers' convention (position t is trained to predict
    ``labels[t + 1]``; ``IGNORE`` masks; default ``input_ids``), so the loss over the shards is
    ``model(input_ids, labels=labels).loss`` of one process."""
    if input_ids.dim() != 2:
        raise ValueError(f"shard_sequence: input_ids must be [batch, length], got {tuple(input_ids.shape)}")
    P, r = _world(group), _rank(group)
    B, T = input_ids.shape
    labels = input_ids if labels is None else labels
    padded = -(-T // P) * P
    ids = torch.full((B, padded), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    ids[:, :T] = input_ids
    following = torch.full_like(ids, pad_id)
    following[:, :T - 1] = input_ids[:, 1:]
    targets = torch.full((B, padded), IGNORE, dtype=torch.long, device=input_ids.device)
    targets[:, :T - 1] = labels[:, 1:]
    local = padded // P
    cut = slice(r * local, (r + 1) * local)
    positions = torch.arange(padded, device=input_ids.device)[cut].expand(B, local)
    return Shard(ids[:, cut], positions, following[:, cut], targets[:, cut], r * local, T, padded)


# ---------------------------------------------------------------------------------------------
# Attention


def check_heads(config, world: int) -> None:
    """Raise ValueError unless ``config``'s query and key/value head counts both divide among
    ``world`` ranks (Ulysses gives each rank whole heads)."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % world or kv % world:
        raise ValueError(f"sequence parallelism over {world} ranks needs the attention heads and key/value heads "
                         f"divisible by the world size {world}; this model has num_attention_heads={heads}, "
                         f"num_key_value_heads={kv}")


def ulysses_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      sliding_window: int | None = None, **kwargs):
    """transformers attention function. query [B, H, T/P, d], key/value [B, H_kv, T/P, d] over the
    rank's tokens; returns ([B, T/P, H, d], None). Outside ``sequence_parallel`` it is
    transformers' SDPA attention."""
    group = getattr(_STATE, "group", None)
    if group is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      sliding_window=sliding_window, **kwargs)
    P = _world(group)
    if query.shape[1] % P or key.shape[1] % P:
        raise ValueError(f"sequence parallelism over {P} ranks: {query.shape[1]} query heads and {key.shape[1]} "
                         f"key/value heads do not divide by the world size {P}")
    if sliding_window is not None and sliding_window < query.shape[2] * P:
        raise NotImplementedError(f"sequence parallelism: a sliding window ({sliding_window}) shorter than the "
                                  f"sequence ({query.shape[2] * P}) is not supported")
    # token split -> head split: [B, heads, T/P, d] -> [B, heads/P, T, d]
    q, k, v = (_AllToAll.apply(x, 1, 2, group) for x in (query, key, value))
    if k.shape[1] != q.shape[1]:  # grouped-query attention: rank j holds query heads j*H/P.. and their kv heads
        rep = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(rep, dim=1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, dropout_p=dropout)
    out = _AllToAll.apply(out, 2, 1, group)  # back: [B, heads/P, T, d] -> [B, heads, T/P, d]
    return out.transpose(1, 2).contiguous(), None


def _mask(*args, **kwargs):
    """Mask function under ``ATTENTION``: none inside a sequence-parallel forward (the attention
    is causal by itself), transformers' SDPA mask else."""
    if getattr(_STATE, "group", None) is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def _register() -> None:
    if not _REGISTERED:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface
        except ImportError as e:
            raise RuntimeError("sequence parallelism needs a transformers with AttentionInterface and "
                               "AttentionMaskInterface") from e
        AttentionInterface.register(ATTENTION, ulysses_attention)
        AttentionMaskInterface.register(ATTENTION, _mask)
        _REGISTERED.append(True)


@contextlib.contextmanager
def sequence_parallel(model: torch.nn.Module, group=None) -> Iterator[None]:
    """Inside the context, ``model``'s forwards in this thread run sequence-parallel over
    ``group`` (default: the world): each rank passes its ``Shard``'s ``input_ids`` and
    ``position_ids`` (no attention mask, no cache). Raises ValueError when the head counts do not
    divide by the group's size."""
    if not dist.is_initialized():
        raise RuntimeError("sequence_parallel: no torch.distributed process group is initialized")
    check_heads(model.config, _world(group))
    _register()
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = ATTENTION
    _STATE.group = group if group is not None else dist.group.WORLD
    try:
        yield
    finally:
        _STATE.group = None
        cfg._attn_implementation = before


# ---------------------------------------------------------------------------------------------
# Loss


@dataclass
class SequenceLoss:
    loss: torch.Tensor
    """The mean token loss over the whole sequence (every rank's tokens), equal on every rank and
    differentiable: ``loss.backward()`` on every rank, then ``reduce_gradients``."""
    logprobs: torch.Tensor
    """[B, T - 1] (detached, gathered from every rank): the log-prob of token t + 1 at position t,
    as one process computes it from ``model(input_ids).logits``."""
    local_logprobs: torch.Tensor
    """[B, T_pad / P] (differentiable): this rank's positions' log-probs of the next token (of
    ``pad_id`` from the sequence's last token on: meaningless there)."""
    tokens: int
    """The number of target tokens of the whole sequence (the mean's denominator)."""


def sequence_loss(model: torch.nn.Module, input_ids: torch.Tensor, group=None, labels: torch.Tensor | None = None,
                  pad_id: int = 0) -> SequenceLoss:
    """Forward ``input_ids`` [B, T] (the same tensor on every rank) sequence-parallel over
    ``group`` and return its mean next-token loss, equal on every rank and to one process's
    ``model(input_ids, labels=labels).loss`` (``labels`` default ``input_ids``)."""
    group = group if group is not None else dist.group.WORLD
    shard = shard_sequence(input_ids, group, labels=labels, pad_id=pad_id)
    with sequence_parallel(model, group):
        logits = model(input_ids=shard.input_ids, position_ids=shard.position_ids, use_cache=False).logits
    logp = torch.log_softmax(logits.float(), dim=-1)
    local = logp.gather(-1, shard.next_ids[..., None].long())[..., 0]
    trained = shard.targets != IGNORE
    target_logp = logp.gather(-1, torch.where(trained, shard.targets, 0)[..., None])[..., 0]
    tokens = torch.tensor(float(trained.sum()), device=logits.device)
    dist.all_reduce(tokens, group=group)
    total = _SumOverRanks.apply(-(target_logp * trained).sum(), group)
    n = int(tokens.item())
    return SequenceLoss(total / max(n, 1), gather_sequence(local.detach(), group)[:, :shard.length - 1], local, n)


def gather_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``x`` [B, T_pad / P, ...] concatenated in rank order along dim 1 (no
    gradient): the whole padded sequence's values on every rank."""
    parts = [torch.empty_like(x) for _ in range(_world(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


@torch.no_grad()
def reduce_gradients(model: torch.nn.Module, group=None) -> None:
    """Sum the ranks' parameter gradients into every rank's ``.grad`` (one flat all-reduce per
    dtype): after ``SequenceLoss.loss.backward()`` on every rank, every rank holds the gradient of
    the whole sequence's loss. Every rank must hold gradients for the same parameters."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(reduced.view_as(g))
