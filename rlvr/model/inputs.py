"""Model inputs from token sequences: variable-length rows as one right-padded tensor.

Below both the rollout engine's parity check and the trainers' collation (``rlvr.train.batching``),
so that padding is defined once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_right(rows: Sequence[Sequence], value, dtype) -> torch.Tensor:
    """[len(rows), longest row] tensor of ``dtype``: each row left-aligned, ``value`` after it."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=dtype)
    return out
