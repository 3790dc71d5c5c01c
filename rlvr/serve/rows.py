"""The running batch of a serving engine: rows that join and leave between decode steps.

``FastRows`` runs on rlvr's fast decoder (``rollout/decoder.py``, ``rollout/kv_cache.py``): one
``DecodeState`` of ``capacity`` rows and ``max_len`` cache columns lives as long as the server.
Its layout is the engine's: rows are left-aligned on a shared write column ``col`` (every row's
newest token is at ``col - 1``), and ``valid`` masks each row's columns before its prompt. So:

- join: the new prompts are prefilled together (a ``DecodeState`` of one row per distinct
  prompt, left-padded as the engine pads them) and each one's K/V copied into a free row at
  columns ``[col - L, col)``; when a prompt is longer than ``col``, every running row is first
  shifted right by the difference (their mask moves with them; RoPE positions are per row, so
  a shift changes nothing they compute).
- prefix cache (optional, the fast mode's): each distinct prompt starts from the K/V of its
  longest cached block-aligned prefix (``rollout/prefix_cache.py``), so a shared system prompt
  is prefilled once and later prompts run only their own tokens; every prompt's K/V is stored
  after its prefill. The longest prefix hit then becomes the batch's shared prefix
  (``shared_prefix.py``): rows that start with it keep only the rest of their prompt in their
  cache columns, and decode steps read the prefix's K/V once for all of them.
- leave: ``DecodeState.compact`` keeps the live rows (moved to the front).
- full cache: when ``col`` reaches ``max_len``, every row is shifted left by the first column any
  row still uses. A row never spans more than prompt + max_tokens <= ``max_len`` columns
  (admission checks it), so that always frees a column.

The caches start at zero: a joined row's masked columns hold what an earlier row left there
(finite values), never uninitialised memory (0 x NaN would still be NaN).

``HFRows`` is the Hugging Face forward (``rollout/hf_backend.py``) for models the fast decoder
refuses, with capacity 1: one request at a time (``--batching none``); joining rows of different
lengths into a ``DynamicCache`` is what it does not do.
"""

from __future__ import annotations

import torch

from rlvr.rollout.decoder import FastLlama
from rlvr.rollout.hf_backend import HFState
from rlvr.rollout.kv_cache import KVPrefix
from rlvr.rollout.prefix_cache import PrefixCache
from rlvr.serve.shared_prefix import SharedPrefixState


class FastRows:
    """The running rows on the fast decoder (see the module docstring)."""

    def __init__(self, fast: FastLlama, capacity: int, max_len: int, pad_token_id: int,
                 cache: PrefixCache | None = None):
        self.fast, self.capacity, self.max_len, self.pad = fast, capacity, max_len, pad_token_id
        self.cache = cache
        self.state = (SharedPrefixState(fast, capacity, max_len) if cache is not None
                      else fast.start(capacity, max_len, cuda_graphs=False, share_prompts=False))
        for buf in (*self.state.k, *self.state.v):
            buf.zero_()
        self.state.n, self.state.col = 0, 0

    @property
    def n(self) -> int:
        return self.state.n

    def join(self, prompts: list[list[int]]) -> torch.Tensor:
        """Prefill ``prompts`` (each distinct one once, left-padded together) and add them as the
        last rows; returns their next-token logits [len(prompts), V]."""
        s = self.state
        if s.n + len(prompts) > self.capacity:
            raise RuntimeError("no free row")
        unique = list(dict.fromkeys(tuple(p) for p in prompts))
        at = {p: k for k, p in enumerate(unique)}
        W = max(len(p) for p in unique)
        dev = self.fast.device
        one = self.fast.start(len(unique), W, cuda_graphs=False, share_prompts=False)
        past = [self.cache.lookup(p) for p in unique] if self.cache is not None else None
        logits = one.prefill([list(p) for p in unique], torch.arange(len(unique), device=dev), self.pad, past=past)
        skip = dict.fromkeys(unique, 0)  # prompt tokens a row leaves to the shared prefix
        if self.cache is not None:
            for k, p in enumerate(unique):  # views: the cache copies what it keeps
                L = len(p)
                self.cache.insert(p, KVPrefix([K[k, :, W - L:W] for K in one.k], [V[k, :, W - L:W] for V in one.v]))
            s.adopt(unique, past)
            skip = {p: s.shared_len(p) for p in unique}
        need = max(len(p) - skip[p] for p in unique)  # cache columns the new rows take
        if s.n == 0:
            s.col = need
        elif need > s.col:
            self._shift(need - s.col)
        c = s.col
        for p in prompts:
            p = tuple(p)
            r, k, L, P = s.n, at[p], len(p), skip[p]
            for dst, src in zip((*s.k, *s.v), (*one.k, *one.v)):
                dst[r, :, c - L + P:c] = src[k, :, W - L + P:W]
            s.valid[r] = False
            s.valid[r, c - L + P:c] = True
            s.pos[r] = L
            if self.cache is not None:
                s.uses[r] = P > 0
            s.n += 1
        return logits.index_select(0, torch.tensor([at[tuple(p)] for p in prompts], device=dev))

    def retire_prefix(self) -> None:
        """After a weight update: new rows no longer attach to the shared prefix."""
        if isinstance(self.state, SharedPrefixState):
            self.state.retire()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([n] long); returns the next logits [n, V] float32."""
        if self.state.col >= self.max_len:
            self._shift(-self._first_used())
        return self.state.step(tokens)

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (ascending indices), moved to the front."""
        if rows == list(range(self.state.n)):
            return
        self.state.compact(torch.tensor(rows, dtype=torch.long, device=self.fast.device))

    def _first_used(self) -> int:
        """The first cache column any running row attends to."""
        s = self.state
        used = s.valid[: s.n, : s.col].any(0)
        return int(used.nonzero()[0]) if used.any() else s.col

    def _shift(self, d: int) -> None:
        """Move every running row's columns ``[0, col)`` by ``d`` (right when > 0), with its mask."""
        s, n, c = self.state, self.state.n, self.state.col
        if d == 0 or n == 0:
            return
        lo, hi = (0, c) if d > 0 else (-d, c)  # the source columns
        for buf in (*s.k, *s.v, s.valid):
            moved = buf[:n, ..., lo:hi].clone() if buf is s.valid else buf[:n, :, lo:hi].clone()
            if buf is s.valid:
                buf[:n] = False
                buf[:n, lo + d:hi + d] = moved
            else:
                buf[:n, :, lo + d:hi + d] = moved
        s.col = c + d


class HFRows:
    """One row at a time on the Hugging Face forward (see the module docstring)."""

    capacity = 1

    def __init__(self, model: torch.nn.Module, pad_token_id: int):
        self.model, self.pad = model, pad_token_id
        self.state: HFState | None = None

    @property
    def n(self) -> int:
        return 0 if self.state is None else 1

    def join(self, prompts: list[list[int]]) -> torch.Tensor:
        if self.state is not None or len(prompts) != 1:
            raise RuntimeError("no free row")
        self.state = HFState(self.model)
        return self.state.prefill(prompts, torch.zeros(1, dtype=torch.long, device=self.state.device), self.pad)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.state.step(tokens)

    def keep(self, rows: list[int]) -> None:
        if not rows:
            self.state = None
