"""Training forward without padding waste: per-token log-probs of right-padded sequences.

What it does:
- ``pack`` lays the sequences of a right-padded ``[B, T]`` batch end to end into ``R`` rows of
  ``width`` tokens (first-fit decreasing; ``width`` defaults to the longest sequence, so no row is
  longer than the padded batch and attention costs no more), with per-sequence ``position_ids``
  (0, 1, 2, ... restarting at each sequence) and a block-diagonal causal mask: a token attends to
  the earlier tokens of its own sequence only. The padded batch's ``B * T`` slots become about
  ``sum(lengths)`` (the last row's tail and any gaps are the only padding left).
- ``causal_rows`` keeps the right-padded rows and drops the padding mask: padding follows every
  real token, so the plain causal mask already keeps it out of sight, and attention runs SDPA's
  unmasked causal kernel.
- ``packed_logprobs`` runs the model once, packed when that removes at least ``PACK_MIN_SAVING``
  (10%) of the token slots, else on ``causal_rows``, and returns the same ``[B, T]`` log-probs as
  ``rlvr.rollout.engine.sequence_logprobs`` at the positions asked for (``want``, e.g. the loss
  mask), 0.0 elsewhere. The language-model head and the log-softmax run only at those positions
  (for plain-head decoders: Llama, Qwen2/3, Mistral, Phi-3 ...): no ``[B, T, V]`` logits for
  prompt tokens. Gradients flow as in the plain path.

Why it is exact: within a row, the mask lets each token see exactly the tokens its own sequence
has before it, and rotary positions restart at 0 per sequence, so every hidden state equals the
one of the padded forward (up to float summation order); tests/test_packing.py checks log-probs,
loss and gradients against the plain right-padded path.

How the mask reaches the model: as a 4D additive float mask ``[R, 1, width, width]`` (0 where
attention is allowed, the dtype's minimum elsewhere), the form every transformers version since
4.4x passes to SDPA/eager attention unchanged. FlashAttention-2 models ignore 4D masks; use
``algo.packing=false`` for them (or any model whose attention does not accept a 4D mask).

Not here: the loss (``rlvr.algos.losses``), collation (``rlvr.train.batching``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    slot: torch.Tensor

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Block-diagonal causal mask [R, 1, W, W], additive: 0 = attend, dtype min = masked."""
        W = self.segment.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=self.segment.device).tril()
        allowed = (self.segment[:, :, None] == self.segment[:, None, :]) & causal
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


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int | None = None,
         pad_token_id: int = 0) -> Packed:
    """Pack a right-padded batch ([B, T], mask 1 on real tokens) into rows of ``width`` tokens."""
    B, T = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()
    width = max(int(width or 0), max(lengths), 1)
    bins = first_fit_decreasing(lengths, width)
    R, device = len(bins), input_ids.device
    seq_row = torch.empty(B, dtype=torch.long)
    seq_start = torch.empty(B, dtype=torch.long)
    for r, members in enumerate(bins):
        offset = 0
        for i in members:
            seq_row[i], seq_start[i] = r, offset
            offset += lengths[i]
    seq_row, seq_start = seq_row.to(device), seq_start.to(device)
    cols = torch.arange(T, device=device)
    real = cols[None, :] < torch.as_tensor(lengths, device=device)[:, None]  # [B, T]
    slot = torch.where(real, seq_row[:, None] * width + seq_start[:, None] + cols[None, :],
                       torch.full_like(real, -1, dtype=torch.long))
    b_idx, t_idx = real.nonzero(as_tuple=True)
    dst = slot[b_idx, t_idx]
    ids = torch.full((R * width,), pad_token_id, dtype=input_ids.dtype, device=device)
    ids[dst] = input_ids[b_idx, t_idx]
    # Unused slots: their own segment per row, positions counting from the row's start (harmless).
    segment = (-1 - torch.arange(R, device=device))[:, None].expand(R, width).reshape(-1).clone()
    segment[dst] = b_idx
    positions = torch.arange(width, device=device).repeat(R)
    positions[dst] = t_idx
    return Packed(ids.view(R, width), positions.view(R, width), segment.view(R, width), slot)


def _decoder_and_head(model: torch.nn.Module):
    """(base decoder, lm head) when logits are exactly ``head(decoder(...).last_hidden_state)``."""
    cfg = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if getattr(cfg, "model_type", None) in _PLAIN_HEAD and isinstance(head, torch.nn.Linear) and base is not None \
            and not getattr(cfg, "final_logit_softcapping", None):
        return base, head
    return None, None


# Pack only when it removes at least this share of the padded batch's token slots: a packed
# forward needs an explicit mask (SDPA's masked kernel), the right-padded one only the causal flag.
PACK_MIN_SAVING = 0.10


def causal_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """The right-padded batch as is, attended with the plain causal mask (no padding mask needed:
    padding comes after every real token, so no real token can see it)."""
    B, T = input_ids.shape
    cols = torch.arange(T, device=input_ids.device)
    slot = torch.where(attention_mask.bool(), torch.arange(B, device=input_ids.device)[:, None] * T + cols,
                       torch.full_like(input_ids, -1))
    return Packed(input_ids, cols.expand(B, T), None, slot)


def packed_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    want: torch.Tensor | None = None, *, width: int | None = None,
                    packing: bool | None = None) -> torch.Tensor:
    """log pi(input_ids[b, t] | input_ids[b, :t]) at the positions where ``want`` is nonzero.

    Same values as ``sequence_logprobs(model, input_ids, attention_mask)`` there (up to float
    summation order), 0.0 elsewhere (``want`` defaults to every real token but the first).
    ``packing``: True packs (``pack``), False keeps the padded rows with a causal-only mask
    (``causal_rows``), None (default) packs when that saves ``PACK_MIN_SAVING`` of the slots.
    input_ids, attention_mask, want: [B, T], right-padded -> [B, T] float32.
    """
    B, T = input_ids.shape
    if packing is None:
        stats = padding_stats(attention_mask, width)
        packing = stats["packed_slots"] <= (1 - PACK_MIN_SAVING) * stats["padded_slots"]
    rows = pack(input_ids, attention_mask, width) if packing else causal_rows(input_ids, attention_mask)
    real = attention_mask.bool()
    targets = real.clone()
    targets[:, 0] = False
    if want is not None:
        targets &= want.bool()
    b_idx, t_idx = targets.nonzero(as_tuple=True)  # token (b, t) is predicted from the slot of (b, t - 1)
    src = rows.slot[b_idx, t_idx - 1]
    dtype = next(model.parameters()).dtype
    inputs = {"input_ids": rows.input_ids, "use_cache": False}
    if packing:
        inputs.update(attention_mask=rows.attention_mask(dtype), position_ids=rows.position_ids)
    base, head = _decoder_and_head(model)
    if base is not None:
        hidden = base(**inputs).last_hidden_state
        logits = head(hidden.reshape(-1, hidden.shape[-1])[src]).float()
    else:
        logits = model(**inputs).logits
        logits = logits.reshape(-1, logits.shape[-1])[src].float()
    tgt = input_ids[b_idx, t_idx]
    lp = logits.gather(-1, tgt[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(B * T, dtype=torch.float32, device=input_ids.device)
    out = out.index_put((b_idx * T + t_idx,), lp)
    return out.view(B, T)


def padding_stats(attention_mask: torch.Tensor, width: int | None = None) -> dict[str, float]:
    """Token slots of the padded batch vs the packed rows, for metrics and benchmarks."""
    lengths = attention_mask.sum(dim=1).tolist()
    w = max(int(width or 0), max(lengths), 1)
    rows = len(first_fit_decreasing(lengths, w))
    return {"real_tokens": float(sum(lengths)), "padded_slots": float(attention_mask.numel()),
            "packed_slots": float(rows * w)}


__all__ = ["PACK_MIN_SAVING", "Packed", "causal_rows", "first_fit_decreasing", "pack", "packed_logprobs",
           "padding_stats"]
