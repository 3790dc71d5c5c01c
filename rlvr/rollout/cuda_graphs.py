"""The fast decoder's decode step captured in CUDA graphs, one per batch-size bucket.

Buckets are powers of two, the last being all rows; rows beyond those in use are padding. The
captured step (``DecodeState.step_static``) attends over the whole cache under the mask and
writes K/V at a column held in a device tensor, so one graph serves every step. A capture
failure warns and falls back to eager steps (docs/rollout.md, "CUDA graphs").
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlvr.rollout.kv_cache import DecodeState


def bucket(n: int, cap: int) -> int:
    """The smallest power of two >= ``n``, at most ``cap``."""
    b = 1
    while b < n:
        b *= 2
    return min(b, cap)


class StepGraphs:
    """CUDA graphs of ``DecodeState.step_static``, one per batch-size bucket, captured on first use."""

    def __init__(self, state: DecodeState):
        self.state = state
        dev = state.f.device
        self.tokens = torch.zeros(state.rows, dtype=torch.long, device=dev)
        self.col = torch.zeros(1, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.enabled = True

    def step(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The next logits of the rows in use, or None when graphs are off (step eagerly)."""
        if not self.enabled:
            return None
        s = self.state
        n = tokens.shape[0]
        b = bucket(n, s.rows)
        self.tokens[:n].copy_(tokens)
        self.col.fill_(s.col)
        if b not in self.graphs:
            try:
                self.graphs[b] = self._capture(b)
            except Exception as e:  # noqa: BLE001  (any capture failure: decode eagerly)
                warnings.warn(f"CUDA graph capture failed ({e}); decoding without graphs", stacklevel=2)
                self.enabled = False
                return None
        graph, out = self.graphs[b]
        graph.replay()
        return out[:n]

    def _capture(self, b: int):
        s = self.state
        n_saved = s.n
        # The warm-up runs compute the real step for the current inputs (idempotent writes), and
        # the replay after capture computes it again: the same values land in the same places.
        pos_saved = s.pos.clone()  # (before the side stream's wait: its clone is then done when read there)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                for _ in range(2):
                    s.pos.copy_(pos_saved)
                    s.step_static(self.tokens[:b], self.col)
            torch.cuda.current_stream().wait_stream(stream)
            s.pos.copy_(pos_saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = s.step_static(self.tokens[:b], self.col)
        finally:  # the replay (or the eager fallback) advances the positions, not the warm-up
            torch.cuda.current_stream().wait_stream(stream)
            s.pos.copy_(pos_saved)
            s.n = n_saved
        return graph, out
