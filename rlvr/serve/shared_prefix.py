"""One prompt prefix kept once for all the running rows that start with it (the fast mode's
decode attention; ``rows.py`` uses it when the prefix cache is on).

Served requests often share a long system prompt. With the prefix cache its K/V are computed
once, but each row of the running batch would still hold a copy in its cache columns, and every
decode step would read all those copies: at 16 rows and a 123-token system prompt that is most
of the K/V a step reads, and reading the K/V cache is what a decode step's attention spends its
time on. ``SharedPrefixState`` is a ``DecodeState`` that keeps such a prefix once:

- ``adopt(prompts, past)``: after a join's cache lookups, when no running row uses the current
  prefix, the longest cache hit among the joining prompts (at least ``min_len`` tokens) becomes
  the shared prefix: its token ids and its K/V (``KVPrefix``, one tensor per layer).
- A joining row whose prompt starts with the prefix (``shared_len``) gets only the rest of its
  prompt in its cache columns and ``uses[r] = True``; its positions still count the prefix.
- A decode step attends in two parts under one softmax (the same sum as one attention over the
  row's whole sequence, in another order): every row's queries at once against the prefix keys
  (one GEMM per KV head, ``M`` = rows x query heads per KV head), masked for rows that do not use
  it, and each row against its own columns, read only from the first column any row uses.
- ``retire()``: after a weight update, new rows no longer attach to the prefix (its K/V came from
  the old weights); rows that use it keep it, as rows keep their own cache across an update.

Without a prefix (or none in use) every step is ``DecodeState``'s own. Tested against the plain
decoder's logits: ``tests/test_serve_fast.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.rollout.kv_cache import DecodeState, KVPrefix


@dataclass
class _PrefixMask:
    """A step's masks with a shared prefix: own columns from ``lo``, additive ``own``
    [n * kv, rep, S - lo]; ``pre`` [n * kv, 1, 1] is 0 for rows that use the prefix, -inf else."""

    lo: int
    own: torch.Tensor
    pre: torch.Tensor


class SharedPrefixState(DecodeState):
    """A ``DecodeState`` with one shared prefix (module docstring)."""

    def __init__(self, f, rows: int, max_len: int, min_len: int = 32):
        super().__init__(f, rows, max_len, cuda_graphs=False, share_prompts=False)
        self.min_len = min_len
        self.prefix: KVPrefix | None = None
        self.prefix_ids: tuple[int, ...] | None = None  # None: new rows do not attach
        self.uses = torch.zeros(rows, dtype=torch.bool, device=f.device)

    @property
    def in_use(self) -> bool:
        return self.prefix is not None and bool(self.uses[: self.n].any())

    def adopt(self, prompts: list[tuple[int, ...]], past: list[KVPrefix | None]) -> None:
        """When no running row uses the prefix: the longest hit in ``past`` (``past[k]`` the
        cached K/V of ``prompts[k]``'s first tokens) of at least ``min_len`` tokens becomes it."""
        if self.in_use:
            return
        hits = [(c.length, k) for k, c in enumerate(past) if c is not None and c.length >= self.min_len]
        if not hits:
            self.prefix = self.prefix_ids = None
            return
        m, k = max(hits)
        self.prefix = KVPrefix([t.contiguous() for t in past[k].k], [t.contiguous() for t in past[k].v])
        self.prefix_ids = tuple(prompts[k][:m])

    def shared_len(self, prompt: tuple[int, ...]) -> int:
        """How many of ``prompt``'s first tokens the prefix holds (0: it does not start with it)."""
        ids = self.prefix_ids
        if ids is None or len(prompt) <= len(ids) or tuple(prompt[: len(ids)]) != ids:
            return 0
        return len(ids)

    def retire(self) -> None:
        self.prefix_ids = None

    def compact(self, keep: torch.Tensor) -> None:
        self.uses[: keep.numel()] = self.uses.index_select(0, keep)
        super().compact(keep)

    # -- the decode step's attention ---------------------------------------------------------------
    def _step_mask(self, valid: torch.Tensor, S: int):
        if not self.in_use:
            return super()._step_mask(valid, S)
        f, n = self.f, valid.shape[0]
        lo = int(valid[:, :S].any(0).nonzero()[0])  # the first column any row's own part uses
        own = torch.zeros((n, S - lo), dtype=f.kv_dtype, device=f.device).masked_fill_(~valid[:, lo:S], float("-inf"))
        own = own[:, None].expand(n, f.num_heads, S - lo).reshape(n * f.num_kv, f.rep, S - lo)
        pre = torch.zeros(n, dtype=f.kv_dtype, device=f.device).masked_fill_(~self.uses[:n], float("-inf"))
        return _PrefixMask(lo, own, pre[:, None].expand(n, f.num_kv).reshape(n * f.num_kv, 1, 1))

    def _attend(self, li: int, q: torch.Tensor, mask) -> torch.Tensor:
        if not isinstance(mask, _PrefixMask):
            return super()._attend(li, q, mask)
        f, n, S, lo = self.f, self.n, self.col + 1, mask.lo
        nh, nkv, hd, rep = f.num_heads, f.num_kv, f.head_dim, f.rep
        P = self.prefix.length
        qs = q.reshape(n, nkv, rep, hd) * hd ** -0.5
        by_head = qs.permute(1, 0, 2, 3).reshape(nkv, n * rep, hd)  # every row's queries, per KV head
        s_pre = torch.bmm(by_head, self.prefix.k[li].transpose(1, 2))  # [nkv, n * rep, P]
        s_pre = s_pre.view(nkv, n, rep, P).transpose(0, 1).reshape(n * nkv, rep, P) + mask.pre
        K, V = self.k[li], self.v[li]
        s_own = torch.baddbmm(mask.own, qs.reshape(n * nkv, rep, hd),
                              K[:n, :, lo:S].reshape(n * nkv, S - lo, hd).transpose(1, 2))
        p = torch.cat([s_pre, s_own], dim=-1).softmax(-1)  # [n * nkv, rep, P + S - lo]
        p_pre = p[..., :P].reshape(n, nkv, rep, P).transpose(0, 1).reshape(nkv, n * rep, P)
        a_pre = torch.bmm(p_pre, self.prefix.v[li]).view(nkv, n, rep, hd).transpose(0, 1).reshape(n * nkv, rep, hd)
        a = torch.baddbmm(a_pre, p[..., P:], V[:n, :, lo:S].reshape(n * nkv, S - lo, hd))
        return a.view(n, nh * hd)
