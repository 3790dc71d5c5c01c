"""Shared prompts for CPU decode steps: each prompt's K/V kept once for all of its sample rows.

A decode step attends in two parts under one softmax: the queries of all of a prompt's rows,
stacked, against the prompt's keys (one GEMM per prompt and KV head instead of one
matrix-vector product per row), and each row's query against its own generated columns. The
rows' own cache columns before the prompts' width are then never written (``DecodeState``:
prefill does not copy the prompt to every row, compaction moves only generated columns,
``prefix`` takes the prompt's columns from here). Why: docs/rollout.md, "Shared prompts".
"""

from __future__ import annotations

from collections import Counter

import torch


class SharedPrompts:
    """The prompts' K/V once per prompt, and attention of a CPU decode step over them plus each
    row's generated columns.

    Rows are grouped by prompt (each prompt's rows consecutive, as ``engine.generate`` orders
    them, and compaction keeps the order). A step lays the rows' queries on a grid of ``U`` prompts
    x ``G`` slots (``G`` = the most rows any prompt has): prompt ``u``'s queries form one
    ``[G x rep, hd]`` matrix per KV head, multiplied with the prompt's keys in one batched GEMM.
    When every prompt has ``G`` rows the grid is the rows themselves (``slots`` is None);
    otherwise ``slots[r]`` is row r's cell and empty cells compute zeros that are never read."""

    def __init__(self, U: int, W: int, mask: torch.Tensor, nkv: int, dtype: torch.dtype):
        self.prompts, self.width, self.nkv = U, W, nkv
        self.k: list[torch.Tensor] = []  # per layer [U * nkv, W, hd]
        self.v: list[torch.Tensor] = []
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        self.bias = bias[:, None, None].expand(U, nkv, 1, W).reshape(U * nkv, 1, W)  # left padding
        self.rows: list[int] = []

    def set_rows(self, rows: list[int]) -> None:
        """``rows[r]`` = the prompt of decoder row r (ascending)."""
        self.rows = rows
        self.G = max(Counter(rows).values())
        self.slots = None
        if len(rows) != self.prompts * self.G:  # cell = prompt x G + rank among the prompt's rows
            first: dict[int, int] = {}
            slots = [p * self.G + r - first.setdefault(p, r) for r, p in enumerate(rows)]
            self.slots = torch.tensor(slots, device=self.bias.device)

    def prompt_kv(self, layer: int, row: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of decoder row ``row``'s prompt in layer ``layer``, from column ``start``:
        ``[nkv, W - start, hd]`` each."""
        u, W = self.rows[row], self.width
        return (self.k[layer].view(self.prompts, self.nkv, W, -1)[u, :, start:],
                self.v[layer].view(self.prompts, self.nkv, W, -1)[u, :, start:])

    def attend(self, li: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """q [n, nh, hd] (roped), k_new/v_new [n, nkv, t, hd] the rows' generated columns (the
        current one included) -> attention output [n, nh * hd]."""
        n, nh, hd = q.shape
        W, nkv = self.width, self.nkv
        rep, t = nh // nkv, k_new.shape[2]
        q = q * hd ** -0.5
        grid = self._to_grid(q.reshape(n, nkv, rep, hd))  # [U * nkv, G * rep, hd]
        s_prompt = torch.baddbmm(self.bias, grid, self.k[li].transpose(1, 2))  # [U * nkv, G * rep, W]
        s_new = torch.bmm(q.reshape(n * nkv, rep, hd), k_new.reshape(n * nkv, t, hd).transpose(1, 2))
        p = torch.cat([self._from_grid(s_prompt), s_new], dim=-1).softmax(-1)  # [n * nkv, rep, W + t]
        a_prompt = torch.bmm(self._to_grid(p[..., :W].reshape(n, nkv, rep, W)), self.v[li])
        a = torch.baddbmm(self._from_grid(a_prompt), p[..., W:], v_new.reshape(n * nkv, t, hd))
        return a.view(n, nh * hd)

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[n, nkv, rep, d] per row -> [U * nkv, G * rep, d] per prompt and KV head."""
        _, nkv, rep, d = x.shape
        if self.slots is not None:
            x = x.new_zeros((self.prompts * self.G, nkv, rep, d)).index_copy_(0, self.slots, x)
        return x.view(self.prompts, self.G, nkv, rep, d).transpose(1, 2).reshape(-1, self.G * rep, d)

    def _from_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[U * nkv, G * rep, d] -> [n * nkv, rep, d] in row order."""
        d = x.shape[-1]
        x = x.view(self.prompts, self.nkv, self.G, -1, d).transpose(1, 2)  # [U, G, nkv, rep, d]
        rep = x.shape[3]
        x = x.reshape(self.prompts * self.G, self.nkv, rep, d)
        if self.slots is not None:
            x = x.index_select(0, self.slots)
        return x.reshape(-1, rep, d)
