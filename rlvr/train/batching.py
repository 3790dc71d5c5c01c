"""Collation: variable-length token sequences -> right-padded tensors (a ``Batch``).

Every trainer builds its tensors here so padding, masks and alignment are defined once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rlvr.model.inputs import pad_right
from rlvr.types import Batch, Trajectory


def collate(trajectories: Sequence[Trajectory], advantages: Sequence[float], pad_token_id: int) -> Batch:
    """Trajectories (token ids, loss mask, sampling logprobs) + one advantage each -> Batch."""
    ids = pad_right([t.token_ids for t in trajectories], pad_token_id, torch.long)
    return Batch(
        input_ids=ids,
        attention_mask=pad_right([[1] * len(t.token_ids) for t in trajectories], 0, torch.long),
        loss_mask=pad_right([t.loss_mask for t in trajectories], 0, torch.float32),
        old_logprobs=pad_right([t.logprobs for t in trajectories], 0.0, torch.float32),
        advantages=torch.tensor(list(advantages), dtype=torch.float32),
    )


def select(batch: Batch, rows: torch.Tensor) -> Batch:
    """Rows of a batch, trimmed to the longest remaining sequence (saves compute on padding);
    token-level advantages [B, T] are trimmed with the rest."""
    width = int(batch.attention_mask[rows].sum(dim=1).max())
    cut = lambda x: None if x is None else x[rows, :width]  # noqa: E731
    return Batch(
        input_ids=cut(batch.input_ids), attention_mask=cut(batch.attention_mask),
        loss_mask=cut(batch.loss_mask), old_logprobs=cut(batch.old_logprobs),
        advantages=batch.advantages[rows] if batch.advantages.dim() == 1 else cut(batch.advantages),
        ref_logprobs=cut(batch.ref_logprobs),
        is_weights=cut(batch.is_weights), stale=None if batch.stale is None else batch.stale[rows],
    )


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    """The example indices of ``step`` (1-based): consecutive slices of a per-epoch permutation seeded by
    (seed, epoch), so the order is a pure function of the step (exact resume)."""
    per_epoch = math.ceil(n / batch_size)
    epoch, slot = divmod(step - 1, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    return order[slot * batch_size: (slot + 1) * batch_size]
