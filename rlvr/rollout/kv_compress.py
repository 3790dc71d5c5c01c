"""Memory-bounded KV caches for the fast decoder: ``SamplingParams.kv_cache`` = ``int8`` or
``sink_window`` (``full`` is ``kv_cache.DecodeState`` itself).

- ``Int8State`` (``kv_cache="int8"``): the K and V of every token older than the most recent
  ``kv_window`` are stored as int8 with one scale per (row, KV head, token) (symmetric:
  ``scale = absmax / 127``, ``q = round(x / scale)``), dequantised to the cache dtype for each
  decode step's attention; the recent ``kv_window`` tokens are kept in full precision in a ring
  buffer of ``kv_window`` columns (column c in slot ``c % kv_window``; a column leaving the window
  is quantised just before its slot is reused). Storage: ``hd`` int8 bytes plus one scale per
  token and head instead of ``hd`` values of the cache dtype. The prompt's own prefill attends
  to its exact K/V (quantisation applies from the first decode step on). With ``kv_window`` at
  least the sequence length nothing is quantised and the results equal ``full`` bit for bit.
- ``SinkWindowState`` (``kv_cache="sink_window"``, StreamingLLM, Xiao et al. 2023): each query
  attends to the first ``kv_sinks`` tokens of its row plus the last ``kv_window`` tokens (itself
  included), in prefill and in decode steps. RoPE positions stay the original absolute positions
  (the variant without re-positioning inside the cache). The cache holds ``kv_sinks + kv_window
  + slack`` columns (``slack = max(kv_window, 8)``), fixed whatever the length: when it is full,
  the columns no query can attend to any more are evicted (each row's kept columns gathered to the
  front, right-aligned, so rows stay aligned at the newest column) — periodic compaction, one
  gather of ``sinks + window`` columns per ``slack`` steps. Each column's absolute position
  (``colpos``) gives the mask. A prompt longer than the cache is compacted right after prefill
  (during prefill its K/V are held at full width, once per distinct prompt).

Both keep every row's prompt in its own rows (no shared prompts), run without CUDA graphs and
without prefix reuse (``past`` / ``keep_cache``: ``prefix`` refuses); the engine chooses them only
when asked (``engine.generate`` turns graphs and sharing off for them). Rows finishing early
(compaction of rows), ``n > 1`` samples and stop tokens work as with ``full``. They make the
rollouts slightly off-policy: the trainer recomputes exact log-probs, and
``rollout/logprob_mismatch_kl`` measures the gap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlvr.rollout.kv_cache import DecodeState, KVPrefix, PrefillLayout

if TYPE_CHECKING:
    from rlvr.rollout.decoder import FastLlama

KV_CACHES = ("full", "int8", "sink_window")


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 over the last dim: (q int8, scale [...] in x's dtype), ``x ~ q * scale``."""
    scale = x.abs().amax(-1).float().clamp(min=1e-12) / 127
    q = torch.round(x.float() / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.to(x.dtype)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return q.to(dtype) * scale[..., None].to(dtype)


def _take_rows(buf: torch.Tensor, first: int, m: int, tail: torch.Tensor, cols: int | None) -> None:
    """Rows ``tail`` of ``buf`` moved to ``first .. m-1`` (only the first ``cols`` entries of the
    column dim, dim 2 for K/V-like buffers and dim 1 for masks; all when ``cols`` is None)."""
    if cols is None:
        buf[first:m] = buf.index_select(0, tail)
    elif buf.dim() == 2:
        buf[first:m, :cols] = buf[:, :cols].index_select(0, tail)
    else:
        buf[first:m, :, :cols] = buf[:, :, :cols].index_select(0, tail)


class _Bounded(DecodeState):
    """What both compressed caches share: no shared prompts, no CUDA graphs, no prefix reuse,
    per-row storage of the prompts' K/V after prefill."""

    in_place = False

    def __init__(self, f: FastLlama, rows: int, max_len: int, window: int, sinks: int = 0):
        if window < 1:
            raise ValueError(f"kv_window must be >= 1, got {window}")
        self.window, self.sinks = window, sinks
        super().__init__(f, rows, max_len, cuda_graphs=False, share_prompts=False)

    def _store_prompt_kv(self, p: PrefillLayout, li: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if li == 0:
            self._prompt_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prompt_kv.append((k, v))  # stored per row by ``_after_prefill``

    def prefix(self, row: int, start: int) -> KVPrefix:
        raise ValueError(f"kv_cache={self.name!r} keeps no exact prefix: prefix reuse (past / keep_cache) "
                         "needs kv_cache='full'")

    def worth_compacting(self, alive: int, remaining: int) -> bool:
        return (self.n - alive) * remaining >= alive

    def compact(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (ascending), moved to the front; rows already in place are not
        copied. What a row owns besides ``pos`` is moved by the cache's ``_move_rows``."""
        keep_l = keep.tolist()
        first = next((i for i, r in enumerate(keep_l) if r != i), len(keep_l))
        m = len(keep_l)
        if first < m:
            tail = keep[first:]
            self._move_rows(first, m, tail)
            self.pos[first:m] = self.pos.index_select(0, tail)
        self.n = m

    def _move_rows(self, first: int, m: int, tail: torch.Tensor) -> None:
        raise NotImplementedError


class Int8State(_Bounded):
    """int8 K/V beyond the recent ``window`` tokens (module docstring)."""

    name = "int8"

    def _allocate(self, cuda_graphs: bool) -> None:
        f = self.f
        self.R = min(self.window, self.max_len)  # full-precision ring columns
        old = max(self.max_len - self.R, 0)  # columns that can ever be quantised
        ring = (self.rows, f.num_kv, self.R, f.head_dim)
        q8 = (self.rows, f.num_kv, old, f.head_dim)
        dev, dt = f.device, f.kv_dtype
        self.k = [torch.empty(ring, dtype=dt, device=dev) for _ in f.layers]
        self.v = [torch.empty(ring, dtype=dt, device=dev) for _ in f.layers]
        self.qk = [torch.empty(q8, dtype=torch.int8, device=dev) for _ in f.layers]
        self.qv = [torch.empty(q8, dtype=torch.int8, device=dev) for _ in f.layers]
        self.sk = [torch.empty(q8[:3], dtype=dt, device=dev) for _ in f.layers]
        self.sv = [torch.empty(q8[:3], dtype=dt, device=dev) for _ in f.layers]
        self.valid = torch.zeros((self.rows, self.max_len), dtype=torch.bool, device=dev)

    def kv_bytes(self) -> int:
        bufs = [*self.k, *self.v, *self.qk, *self.qv, *self.sk, *self.sv]
        return sum(t.numel() * t.element_size() for t in bufs)

    def _after_prefill(self, p: PrefillLayout) -> None:
        W, R, ex = p.W, self.R, p.expand
        a = max(W - R, 0)  # prompt columns stored as int8 at once
        for li, (k, v) in enumerate(self._prompt_kv):
            for x, q8, sc, ring in ((k, self.qk[li], self.sk[li], self.k[li]), (v, self.qv[li], self.sv[li], self.v[li])):
                x = x.index_select(0, ex)
                if a:
                    q8[:, :, :a], sc[:, :, :a] = quantize(x[:, :, :a])
                    slots = torch.arange(a, W, device=x.device) % R
                    ring[:, :, slots] = x[:, :, a:]
                else:
                    ring[:, :, :W] = x
        self._prompt_kv = []
        self.valid[:, :W] = p.mask.index_select(0, ex)
        self.pos.copy_(p.positions[:, -1].index_select(0, ex) + 1)
        self.col = W

    def _write_kv(self, li: int, k: torch.Tensor, v: torch.Tensor) -> None:
        n, col, R = self.n, self.col, self.R
        slot = col % R
        if col >= R:  # column col - R leaves the window: quantise it before its slot is reused
            for ring, q8, sc in ((self.k[li], self.qk[li], self.sk[li]), (self.v[li], self.qv[li], self.sv[li])):
                q8[:n, :, col - R], sc[:n, :, col - R] = quantize(ring[:n, :, slot])
        self.k[li][:n, :, slot] = k
        self.v[li][:n, :, slot] = v

    def _attend(self, li: int, q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Keys in column order: the dequantised int8 columns, then the ring's (rotated)."""
        n, S, R = self.n, self.col + 1, self.R
        a = S - R  # int8 columns
        if a <= 0:
            return self._attend_over(q, self.k[li][:n, :, :S], self.v[li][:n, :, :S], mask)
        s0 = a % R
        dt = self.f.kv_dtype
        K = torch.cat([dequantize(self.qk[li][:n, :, :a], self.sk[li][:n, :, :a], dt),
                       self.k[li][:n, :, s0:], self.k[li][:n, :, :s0]], 2)
        V = torch.cat([dequantize(self.qv[li][:n, :, :a], self.sv[li][:n, :, :a], dt),
                       self.v[li][:n, :, s0:], self.v[li][:n, :, :s0]], 2)
        return self._attend_over(q, K, V, mask)

    def _move_rows(self, first: int, m: int, tail: torch.Tensor) -> None:
        c = self.col
        old, ring = max(c - self.R, 0), min(c, self.R)
        for buf in (*self.k, *self.v):
            _take_rows(buf, first, m, tail, ring)
        for buf in (*self.qk, *self.qv, *self.sk, *self.sv):
            _take_rows(buf, first, m, tail, old)
        _take_rows(self.valid, first, m, tail, c)


class SinkWindowState(_Bounded):
    """StreamingLLM attention sinks + recent window, in a fixed-size cache (module docstring)."""

    name = "sink_window"

    def _allocate(self, cuda_graphs: bool) -> None:
        f = self.f
        self.cap = min(self.max_len, self.sinks + self.window + max(self.window, 8))
        shape = (self.rows, f.num_kv, self.cap, f.head_dim)
        self.k = [torch.empty(shape, dtype=f.kv_dtype, device=f.device) for _ in f.layers]
        self.v = [torch.empty(shape, dtype=f.kv_dtype, device=f.device) for _ in f.layers]
        self.valid = torch.zeros((self.rows, self.cap), dtype=torch.bool, device=f.device)
        self.colpos = torch.zeros((self.rows, self.cap), dtype=torch.long, device=f.device)

    def _visible(self, kpos: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
        """Whether a key at position ``kpos`` is in a query at ``qpos``'s sinks or window."""
        return (kpos < self.sinks) | (kpos > qpos - self.window)

    def _prefill_mask(self, p: PrefillLayout, s: int, e: int) -> torch.Tensor:
        base = super()._prefill_mask(p, s, e)  # [U, 1, e - s, e]
        kpos, qpos = p.positions[:, None, :e], p.positions[:, s:e, None]
        eye = torch.arange(e, device=kpos.device)[None, :] == torch.arange(s, e, device=kpos.device)[:, None]
        return base & (self._visible(kpos, qpos) | eye)[:, None]

    def _chunk_visible(self, p: PrefillLayout, s: int, e: int):
        qpos = p.positions[:, s:e, None]
        return lambda b0, b1: self._visible(p.positions[:, None, b0:b1], qpos)[:, None]

    def _after_prefill(self, p: PrefillLayout) -> None:
        W, ex = p.W, p.expand
        keep = p.mask.clone()
        if W > self.cap:  # keep what the first decode step (at position = length) can see
            nxt = p.positions[:, -1:] + 1
            keep &= self._visible(p.positions, nxt)
            width = int(keep.sum(1).max())
            idx = torch.sort(keep.int(), dim=1, stable=True).indices[:, W - width:]  # kept ones last, in order
        else:
            width, idx = W, torch.arange(W, device=keep.device).expand(len(p.lengths), W)
        gidx = idx[:, None, :, None].expand(-1, self.f.num_kv, -1, self.f.head_dim)
        for li, (k, v) in enumerate(self._prompt_kv):
            self.k[li][:, :, :width] = k.gather(2, gidx).index_select(0, ex)
            self.v[li][:, :, :width] = v.gather(2, gidx).index_select(0, ex)
        self._prompt_kv = []
        self.valid[:, :width] = keep.gather(1, idx).index_select(0, ex)
        self.colpos[:, :width] = p.positions.gather(1, idx).index_select(0, ex)
        self.pos.copy_(p.positions[:, -1].index_select(0, ex) + 1)
        self.col = width

    def _evict(self) -> None:
        """The cache is full: keep, per row, the columns the next token can see, gathered to the
        front (right-aligned at the newest)."""
        n, c = self.n, self.col
        keep = self.valid[:n, :c] & self._visible(self.colpos[:n, :c], self.pos[:n, None])
        width = int(keep.sum(1).max())
        idx = torch.sort(keep.int(), dim=1, stable=True).indices[:, c - width:]
        gidx = idx[:, None, :, None].expand(-1, self.f.num_kv, -1, self.f.head_dim)
        for buf in (*self.k, *self.v):
            buf[:n, :, :width] = buf[:n, :, :c].gather(2, gidx)
        self.valid[:n, :width] = keep.gather(1, idx)
        self.colpos[:n, :width] = self.colpos[:n, :c].gather(1, idx)
        self.col = width

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.col >= self.cap:
            self._evict()
        return super().step(tokens)

    def _next_mask(self) -> torch.Tensor:
        n, col = self.n, self.col
        self.valid[:n, col] = True
        self.colpos[:n, col] = self.pos[:n]
        S = col + 1
        keep = self.valid[:n, :S] & self._visible(self.colpos[:n, :S], self.pos[:n, None])
        return self._bias(keep)

    def _move_rows(self, first: int, m: int, tail: torch.Tensor) -> None:
        c = self.col
        for buf in (*self.k, *self.v, self.valid, self.colpos):
            _take_rows(buf, first, m, tail, c)


def make_state(f: FastLlama, rows: int, max_len: int, cuda_graphs: bool, kv_cache: str = "full",
               kv_window: int = 0, kv_sinks: int = 0, share_prompts: bool = True) -> DecodeState:
    """The ``DecodeState`` of a ``kv_cache`` option (``full``: the plain one, CUDA graphs and shared
    prompts as asked; the others: neither)."""
    if kv_cache == "full":
        return DecodeState(f, rows, max_len, cuda_graphs, share_prompts)
    if kv_cache == "int8":
        return Int8State(f, rows, max_len, kv_window)
    if kv_cache == "sink_window":
        return SinkWindowState(f, rows, max_len, kv_window, kv_sinks)
    raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}; got {kv_cache!r}")
