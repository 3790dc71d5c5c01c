"""Training forward without padding waste: per-token log-probs of right-padded sequences.

What it does:
- ``flat`` (the default layout where the model allows it): every token once in a single row, no
  padding, a GRPO group's shared prompt once per group; the decoder's matmuls and elementwise
  kernels run on exactly those tokens and attention runs per sequence
  (``rlvr.train.sequence_attention``: queries, keys and values gathered into padded attention
  rows, under the plain causal flag, or a boolean mask when prompts are shared). No 4D additive
  mask over the layout is built.
- ``pack`` (the row layout, for models whose attention cannot run per sequence) lays the
  sequences of a right-padded ``[B, T]`` batch end to end into ``R`` rows of ``width`` tokens
  (first-fit decreasing; ``width`` defaults to the longest sequence, so no row is longer than the
  padded batch and attention costs no more), with per-sequence ``position_ids`` (0, 1, 2, ...
  restarting at each sequence) and a block-diagonal causal mask: a token attends to
  the earlier tokens of its own sequence only. The padded batch's ``B * T`` slots become about
  ``sum(lengths)`` (the last row's tail and any gaps are the only padding left).
- ``causal_rows`` keeps the right-padded rows and drops the padding mask: padding follows every
  real token, so the plain causal mask already keeps it out of sight, and attention runs SDPA's
  unmasked causal kernel.
- **Shared prompts** (``shared_prompts``, ``pack(groups=...)``): the n samples of a GRPO group
  start with the same prompt. Packed with sharing, a row holds one copy of the prompt followed by
  the rest of several of its samples (in the flat layout: one copy per group); each sample's
  tokens see the prompt copy and their own earlier tokens, with positions continuing from the
  prompt's. The prompt's forward and backward run once per row (per group) instead of once per
  sample, and its gradient is the sum over the samples that read it, as in the unshared forward.
  The row width is chosen per batch (``shared_width``): the cheapest layout by a cost model of
  slots and dense-mask attention.
- ``packed_logprobs`` runs the model once: on the ``flat`` layout when
  ``sequence_attention.supported`` (Llama, Qwen2/3, Mistral, Phi-3 ... with transformers' attention
  interface) and no ``width`` is asked for; else packed in rows when that removes at least
  ``PACK_MIN_SAVING`` (10%) of the token slots, else on ``causal_rows``. The flat layout honours
  sliding windows (Mistral, Qwen2/3, Phi-3: ``sequence_attention.window_of``); a model with a
  window shorter than the longest sequence never runs in rows (``window_reason``: Gemma 2/3's
  sliding layers, or any windowed model when a ``width`` is asked for): their 4D mask would stand
  for every layer's mask and drop the window, so it runs on ``causal_rows``, where transformers
  builds each layer's mask itself. It returns the same
  ``[B, T]`` log-probs as ``rlvr.model.logprobs.sequence_logprobs`` at the positions asked for
  (``want``, e.g. the loss mask), 0.0 elsewhere. The language-model head and the log-softmax run
  only at those positions (for plain-head decoders: Llama, Qwen2/3, Mistral, Phi-3 ...): no
  ``[B, T, V]`` logits for prompt tokens. Gradients flow as in the plain path.
- ``packed_hidden`` is that forward without the head: the layout chosen as above, the base
  decoder run on it, its hidden states gathered at the slots that predict the wanted tokens.
  ``packed_logprobs`` puts the LM head on them; the critic (``rlvr.train.critic``) its score head.

Why it is exact: every token sees exactly the tokens its own sequence has before it (a shared
prompt's copy included): per sequence in the flat layout, under the mask within a row. Rotary
positions are each token's position in its own sequence, so every hidden state equals the one of
the padded forward (up to float summation order); tests/test_packing.py checks log-probs,
loss and gradients against the plain right-padded path.

How the row layout's mask reaches the model: as a 4D additive float mask
``[R, 1, width, width]`` (0 where attention is allowed, the dtype's minimum elsewhere), the form
every transformers version since 4.4x passes to SDPA/eager attention unchanged. FlashAttention-2
models ignore 4D masks; use ``algo.packing=false`` for them (or any model whose attention does not
accept a 4D mask). The flat layout passes no mask to the model: a model of a supported family runs
it whatever its configured attention implementation (``sequence_attention`` calls SDPA itself).

Not here: the loss (``rlvr.algos.losses``), collation (``rlvr.train.batching``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule

from rlvr.train import sequence_attention
from rlvr.train.chunked_head import chunked_token_logprobs, token_logprobs

# Decoder families whose causal-LM head is exactly ``lm_head(last_hidden_state)`` (no logit
# scaling or soft-capping): for them the head runs on the wanted positions only.
_PLAIN_HEAD = {"llama", "qwen2", "qwen3", "mistral", "phi3", "smollm3", "olmo2"}


@dataclass
class Packed:
    """Sequences of a right-padded batch laid end to end in rows.

    input_ids    [R, W] long   packed tokens (pad id in unused slots)
    position_ids [R, W] long   position of each token inside its own sequence
    segment      [R, W] long   which sequence a slot holds (-1-row index for unused slots); None for
                               unpacked right-padded rows (``causal_rows``: causal mask only)
    slot         [B, T] long   flat index (row * W + column) of each padded position; -1 on padding
                               (the slots of a shared prompt appear in every sequence of its group)
    prefix       [R, W] long   the segment a slot's sequence reads as its prompt (a shared prompt's
                               segment), or its own segment; None when nothing is shared
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    slot: torch.Tensor
    prefix: torch.Tensor | None = None

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Causal mask [R, 1, W, W] within each segment, plus each sequence's view of its shared
        prompt; additive: 0 = attend, dtype min = masked."""
        W = self.segment.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=self.segment.device).tril()
        allowed = self.segment[:, :, None] == self.segment[:, None, :]
        if self.prefix is not None:
            allowed |= self.prefix[:, :, None] == self.segment[:, None, :]
        allowed &= causal
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None]


def first_fit_decreasing(lengths: list[int], width: int) -> list[list[int]]:
    """Bins (lists of sequence indices) of total length <= ``width``, longest sequences first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                bins[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(width - lengths[i])
    return bins


def shared_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   want: torch.Tensor) -> list[tuple[int, list[int]]]:
    """Groups of sequences that start with the same prompt: ``(P, members)`` where ``P`` is the
    number of tokens before the members' first wanted position (the tokens no loss is taken on, a
    GRPO group's prompt) and those ``P`` tokens are identical. Only prompts of 2+ tokens held by
    2+ sequences; every other sequence is in no group."""
    wanted = want.bool() & attention_mask.bool()
    first = torch.where(wanted.any(dim=1), wanted.int().argmax(dim=1), 0)  # 0: nothing wanted, never shared
    ids = input_ids.cpu()
    groups: dict[tuple[int, bytes], list[int]] = {}
    for b, p in enumerate(first.tolist()):
        if p >= 2:
            groups.setdefault((p, ids[b, :p].numpy().tobytes()), []).append(b)
    return [(p, members) for (p, _), members in groups.items() if len(members) > 1]


def layout_units(lengths: list[int], groups: list[tuple[int, list[int]]] | None,
                 width: int) -> list[tuple[int, list[int]]]:
    """What is laid contiguously in a row: ``(P, members)``, one copy of a shared ``P``-token
    prompt followed by the rest of each member (``P = 0``: one sequence on its own). A group is
    split into as few units as fit in ``width`` (longest members first)."""
    units: list[tuple[int, list[int]]] = []
    grouped: set[int] = set()
    for p, members in groups or ():
        grouped.update(members)
        current: list[int] = []
        used = p
        for i in sorted(members, key=lambda i: -lengths[i]):
            if current and used + lengths[i] - p > width:
                units.append((p, current) if len(current) > 1 else (0, current))
                current, used = [], p
            current.append(i)
            used += lengths[i] - p
        units.append((p, current) if len(current) > 1 else (0, current))
    units += [(0, [i]) for i in range(len(lengths)) if i not in grouped]
    return sorted(units, key=lambda u: min(u[1]))


def _unit_length(unit: tuple[int, list[int]], lengths: list[int]) -> int:
    p, members = unit
    return p + sum(lengths[i] - p for i in members)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int | None = None,
         pad_token_id: int = 0, groups: list[tuple[int, list[int]]] | None = None) -> Packed:
    """Pack a right-padded batch ([B, T], mask 1 on real tokens) into rows of ``width`` tokens.
    ``groups`` (``shared_prompts``): sequences whose first ``P`` tokens are stored once per row."""
    B, T = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()
    width = max(int(width or 0), max(lengths), 1)
    units = layout_units(lengths, groups, width)
    unit_len = [_unit_length(u, lengths) for u in units]
    bins = first_fit_decreasing(unit_len, width)
    R, device = len(bins), input_ids.device
    base, shared, offset, unit_of = ([0] * B for _ in range(4))
    for r, members in enumerate(bins):
        start = r * width
        for u in members:
            p, seqs = units[u]
            o = 0
            for i in seqs:
                base[i], shared[i], offset[i], unit_of[i] = start, p, o, u
                o += lengths[i] - p
            start += unit_len[u]
    base, shared, offset, unit_of = (torch.as_tensor(x, device=device)[:, None] for x in (base, shared, offset, unit_of))
    cols = torch.arange(T, device=device)[None, :]
    real = cols < torch.as_tensor(lengths, device=device)[:, None]  # [B, T]
    in_prompt = cols < shared
    slot = torch.where(real, base + cols + torch.where(in_prompt, 0, offset), -1)
    b_idx, t_idx = real.nonzero(as_tuple=True)
    dst = slot[b_idx, t_idx]
    ids = torch.full((R * width,), pad_token_id, dtype=input_ids.dtype, device=device)
    ids[dst] = input_ids[b_idx, t_idx]  # a shared prompt's slots are written once per member, same values
    # Segments: sequence b is b, the copy of a shared prompt in unit u is B + u. Unused slots: their
    # own segment per row, positions counting from the row's start (harmless).
    own = torch.arange(B, device=device)[:, None]
    segment = (-1 - torch.arange(R, device=device))[:, None].expand(R, width).reshape(-1).clone()
    segment[dst] = torch.where(in_prompt, B + unit_of, own)[b_idx, t_idx]
    prefix = None
    if any(p for p, _ in units):
        prefix = segment.clone()
        prefix[dst] = torch.where(shared > 0, B + unit_of, own).expand(B, T)[b_idx, t_idx]
        prefix = prefix.view(R, width)
    positions = torch.arange(width, device=device).repeat(R)
    positions[dst] = t_idx
    return Packed(ids.view(R, width), positions.view(R, width), segment.view(R, width), slot, prefix)


def flat(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int = 0,
         groups: list[tuple[int, list[int]]] | None = None) -> Packed:
    """Every token once, in a single row with no padding: each sequence's tokens in order, a shared
    prompt (``groups``) once per group followed by the rest of each member. For attention per
    sequence (``rlvr.train.sequence_attention``); ``segment`` and ``prefix`` describe it as for
    ``pack``, whose layout it is with one row as wide as all of it."""
    width = int(attention_mask.sum()) - sum(p * (len(members) - 1) for p, members in groups or ())
    return pack(input_ids, attention_mask, width, pad_token_id, groups)


def window_reason(model: torch.nn.Module, longest: int) -> str | None:
    """Why ``model`` cannot run the row layout (``pack``) on sequences of up to ``longest`` tokens:
    a sliding window (all layers, or some: Gemma 2/3 alternate) shorter than ``longest``. The row
    layout passes a 4D mask, which transformers takes as the mask of every layer, so the windowed
    layers would attend past their window; those models run on ``causal_rows`` (no mask passed:
    transformers builds the causal and the sliding-window masks itself). None: rows are exact."""
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if not window or not getattr(cfg, "use_sliding_window", True):
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if longest <= window:
        return None
    return f"sliding window of {window} tokens, sequences of up to {longest}"


def plain_head_family(model: torch.nn.Module) -> bool:
    """Whether ``model``'s family puts its head straight on the decoder's last hidden state (no
    logit scaling or soft-capping): its head can run on chosen positions only."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in _PLAIN_HEAD and not getattr(cfg, "final_logit_softcapping", None)


def _decoder_and_head(model: torch.nn.Module):
    """(base decoder, lm head) when logits are exactly ``head(decoder(...).last_hidden_state)``;
    (None, None) for a model sharded with FSDP2, whose root unit (embeddings, head) gathers its
    weights only in the model's own forward."""
    if isinstance(model, FSDPModule):
        return None, None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if plain_head_family(model) and isinstance(head, torch.nn.Linear) and base is not None:
        return base, head
    return None, None


# Pack only when it removes at least this share of the padded batch's token slots: a packed
# forward needs an explicit mask (SDPA's masked kernel), the right-padded one only the causal flag.
PACK_MIN_SAVING = 0.10
# Rows that hold shared prompts are at most this many times the longest sequence and at most
# SHARED_MAX_WIDTH tokens (never less than the longest sequence): wider rows share a prompt among
# more of its group, but attention under a dense mask costs more per token the wider the row.
SHARED_WIDTH = 4.0
SHARED_MAX_WIDTH = 256
# Cost of a slot in a row of width w, relative to the rest of its layer: 1 + ATTENTION_PER_COLUMN
# x w / hidden_size. The dense-mask attention of a slot is 4 h w FLOPs per layer against about
# 26 h^2 for the matmuls of a Llama layer (0.15 w / h), and runs ~1.3x less efficiently (measured
# on CPU at the TRL benchmark's shapes: attention 13% of forward + backward at w = 196, h = 256).
ATTENTION_PER_COLUMN = 0.2
_WIDTH_STEP = 8  # candidate widths: every 8 tokens from the longest sequence up


def shared_width(lengths: list[int], groups: list[tuple[int, list[int]]] | None, hidden_size: int) -> int:
    """Row width for packing with shared prompts: the candidate (every ``_WIDTH_STEP`` tokens from
    the longest sequence to ``SHARED_WIDTH`` times it, at most ``SHARED_MAX_WIDTH``) whose layout
    costs least, a slot costing ``1 + ATTENTION_PER_COLUMN * width / hidden_size``. How the
    samples of a group split into rows decides it: e.g. a 16-token prompt with 8 samples of 31
    more tokens fits as two rows of 140 tokens, but a row of 196 holds 5 samples and leaves 3."""
    longest = max(lengths)
    top = max(longest, min(int(SHARED_WIDTH * longest), SHARED_MAX_WIDTH))
    best_cost, best = float("inf"), longest
    for w in sorted({*range(longest, top + 1, _WIDTH_STEP), top}):
        cost = _row_count(lengths, groups, w) * w * (1 + ATTENTION_PER_COLUMN * w / hidden_size)
        if cost < best_cost:
            best_cost, best = cost, w
    return best


def causal_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """The right-padded batch as is, attended with the plain causal mask (no padding mask needed:
    padding comes after every real token, so no real token can see it)."""
    B, T = input_ids.shape
    cols = torch.arange(T, device=input_ids.device)
    slot = torch.where(attention_mask.bool(), torch.arange(B, device=input_ids.device)[:, None] * T + cols,
                       torch.full_like(input_ids, -1))
    return Packed(input_ids, cols.expand(B, T), None, slot)


def packed_hidden(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  want: torch.Tensor | None = None, *, decoder: torch.nn.Module | None = None,
                  width: int | None = None, packing: bool | None = None,
                  share_prompts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The output of the slots that predict the wanted tokens, from one padding-free forward.

    The layout is chosen from ``model`` (its config, attention support, sliding window) as
    ``packed_logprobs`` describes (``packing``, ``width``, ``share_prompts``); ``decoder`` runs on
    it: a base decoder (e.g. a causal LM's or a token-classification model's ``model``), whose
    ``last_hidden_state`` is gathered, or None for ``model`` itself, whose ``logits`` are.
    Token (b, t) is predicted from the slot of (b, t - 1); ``want`` defaults to every real token
    but the first (position 0 and padding are never wanted).
    input_ids, attention_mask, want: [B, T], right-padded -> (out [N, H] at the N wanted (b, t) in
    row-major order, b_idx [N], t_idx [N]).
    """
    groups = shared_prompts(input_ids, attention_mask, want) if share_prompts and want is not None else None
    lengths = attention_mask.sum(dim=1).tolist()
    per_sequence = packing is not False and width is None and sequence_attention.supported(model, max(lengths))
    windowed = window_reason(model, max(lengths))
    if per_sequence:
        rows = flat(input_ids, attention_mask, groups=groups)
    elif windowed is not None:  # a 4D mask would replace the model's window: transformers builds it here
        rows, packing = causal_rows(input_ids, attention_mask), False
    else:
        if groups and width is None:
            width = shared_width(lengths, groups, model.get_input_embeddings().embedding_dim)
        if packing is None:
            stats = padding_stats(attention_mask, width, groups)
            packing = stats["packed_slots"] <= (1 - PACK_MIN_SAVING) * stats["padded_slots"]
        rows = pack(input_ids, attention_mask, width, groups=groups) if packing else causal_rows(input_ids, attention_mask)
    real = attention_mask.bool()
    targets = real.clone()
    targets[:, 0] = False
    if want is not None:
        targets &= want.bool()
    b_idx, t_idx = targets.nonzero(as_tuple=True)  # token (b, t) is predicted from the slot of (b, t - 1)
    # A shared prompt's last slot predicts the first token of every sample in its row, so ``src``
    # repeats. Gathered with ``index_select``, whose backward (``index_add``) sums the repeats in
    # a fixed order; ``hidden[src]``'s backward (``index_put_`` with accumulate) adds them in
    # thread order on CPU, and two-thread runs drifted apart in the last bits from the first step.
    src = rows.slot[b_idx, t_idx - 1]
    inputs = {"input_ids": rows.input_ids, "use_cache": False}
    layout = contextlib.nullcontext()
    if per_sequence:
        window = sequence_attention.window_of(model, max(lengths))
        inputs.update(position_ids=rows.position_ids, **sequence_attention.indices(rows.slot, real, window))
        layout = sequence_attention.sequence_layout(model)
    elif packing:
        mask = rows.attention_mask(next(model.parameters()).dtype)
        inputs.update(attention_mask=mask, position_ids=rows.position_ids)
    with layout:
        if decoder is not None:
            out = decoder(**inputs).last_hidden_state
        else:
            out = model(**inputs).logits
    return out.reshape(-1, out.shape[-1]).index_select(0, src), b_idx, t_idx


def scatter_wanted(values: torch.Tensor, b_idx: torch.Tensor, t_idx: torch.Tensor,
                   shape: torch.Size) -> torch.Tensor:
    """[B, T] float32: ``values`` [N] at the (b, t) of ``packed_hidden``, 0.0 elsewhere; gradients
    flow to ``values``."""
    B, T = shape
    out = torch.zeros(B * T, dtype=torch.float32, device=values.device)
    out = out.index_put((b_idx * T + t_idx,), values.to(torch.float32))
    return out.view(B, T)


def packed_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    want: torch.Tensor | None = None, *, width: int | None = None,
                    packing: bool | None = None, share_prompts: bool = False,
                    logits_chunk: int = 0) -> torch.Tensor:
    """log pi(input_ids[b, t] | input_ids[b, :t]) at the positions where ``want`` is nonzero.

    Same values as ``sequence_logprobs(model, input_ids, attention_mask)`` there (up to float
    summation order), 0.0 elsewhere (``want`` defaults to every real token but the first).
    ``packing``: False keeps the padded rows with a causal-only mask (``causal_rows``); True or
    None (default) runs the ``flat`` layout where ``sequence_attention.supported(model)`` and
    ``width`` is not given, else rows (``pack``): always with True, with None when that saves
    ``PACK_MIN_SAVING`` of the slots.
    A model whose sliding window is shorter than the longest sequence runs on ``causal_rows``
    whatever ``packing`` and ``width`` say (``window_reason``).
    ``share_prompts`` (with ``want``): sequences that start with the same unwanted tokens (a GRPO
    group's prompt, ``shared_prompts``) run that prompt once per group in the flat layout, once
    per row in rows of ``shared_width`` tokens (or ``width``).
    ``logits_chunk`` > 0: the LM head and log-softmax run on that many wanted tokens at a time
    (``rlvr.train.chunked_head``), so all their logits never exist at once.
    The forward is ``packed_hidden``'s; the LM head runs on its output when the model splits
    (``_decoder_and_head``), else the whole model's logits are gathered.
    input_ids, attention_mask, want: [B, T], right-padded -> [B, T] float32.
    """
    base, head = _decoder_and_head(model)
    out, b_idx, t_idx = packed_hidden(model, input_ids, attention_mask, want, decoder=base, width=width,
                                      packing=packing, share_prompts=share_prompts)
    tgt = input_ids[b_idx, t_idx]
    if base is not None:  # the LM head on the wanted slots only, ``logits_chunk`` at a time
        lp = chunked_token_logprobs(head, out, tgt, logits_chunk)
    else:
        lp = token_logprobs(lambda x: x, out, tgt)
    return scatter_wanted(lp, b_idx, t_idx, input_ids.shape)


def padding_stats(attention_mask: torch.Tensor, width: int | None = None,
                  groups: list[tuple[int, list[int]]] | None = None) -> dict[str, float]:
    """Token slots of the padded batch vs the packed rows, for metrics and benchmarks."""
    lengths = attention_mask.sum(dim=1).tolist()
    w = max(int(width or 0), max(lengths), 1)
    return {"real_tokens": float(sum(lengths)), "padded_slots": float(attention_mask.numel()),
            "packed_slots": float(_row_count(lengths, groups, w) * w)}


def _row_count(lengths: list[int], groups: list[tuple[int, list[int]]] | None, width: int) -> int:
    """Rows ``pack`` lays these sequences out in."""
    return len(first_fit_decreasing([_unit_length(u, lengths) for u in layout_units(lengths, groups, width)], width))


__all__ = ["ATTENTION_PER_COLUMN", "PACK_MIN_SAVING", "SHARED_MAX_WIDTH", "SHARED_WIDTH", "Packed", "causal_rows", "first_fit_decreasing", "flat",
           "layout_units", "pack", "packed_hidden", "packed_logprobs", "padding_stats", "plain_head_family", "scatter_wanted", "shared_prompts",
           "shared_width", "window_reason"]
