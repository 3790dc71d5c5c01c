"""Memory-bounded KV caches for the fast decoder: ``SamplingParams.kv_cache`` = ``int8`` or
``sink_window`` (``full`` is ``kv_cache.DecodeState`` itself).

- ``Int8State`` (``kv_cache="int8"``): the K and V of every token older than the most recent
  ``kv_window`` are stored as int8 with one scale per (row, KV head, token) (symmetric:
  ``scale = absmax / 127``, ``q = round(x / scale)``), read by each decode step's attention as
  the int8 values in the cache dtype with the scales applied to scores and probabilities; the
  recent ``kv_window`` tokens are kept in full precision in a ring buffer of ``kv_window`` columns (column c in slot ``c % kv_window``; a column leaving the window
  is quantised just before its slot is reused). Storage: ``hd`` int8 bytes plus one scale per
  token and head instead of ``hd`` values of the cache dtype. A one-pass prefill attends to the
  prompt's exact K/V (quantisation applies from the first decode step on); a chunked prefill
  (``Int8Prefill``) quantises the columns leaving the window as it passes them, and later chunks
  read them dequantised, as decode steps do. With ``kv_window`` at least the sequence length
  nothing is quantised and the results equal ``full``.
- ``SinkWindowState`` (``kv_cache="sink_window"``, StreamingLLM, Xiao et al. 2023): each query
  attends to the first ``kv_sinks`` tokens of its row plus the last ``kv_window`` tokens (itself
  included), in prefill and in decode steps. RoPE positions stay the original absolute positions
  (the variant without re-positioning inside the cache). The cache holds ``kv_sinks + kv_window
  + slack`` columns (``slack = max(kv_window, 8)``), fixed whatever the length: when it is full,
  the columns no query can attend to any more are evicted (each row's kept columns gathered to the
  front, right-aligned, so rows stay aligned at the newest column) — periodic compaction, one
  gather of ``sinks + window`` columns per ``slack`` steps. Each column's absolute position
  (``colpos``) gives the mask. A prompt longer than the cache is compacted right after prefill;
  a chunked prefill (``SinkPrefill``) evicts between chunks, holding only the sinks, the window
  and the chunk (a one-pass prefill holds the prompt's K/V at full width until it ends).

With ``prefill_chunk`` set, then, neither cache ever holds a long prompt's K/V at full precision
and full width: peak memory at 32k tokens is within 1-15% of that at 4k (docs/benchmarks.md).

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

from rlvr.rollout.block_attention import Loader, dense
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
    rope_tables = False  # cos/sin at the positions in use (``FastLlama.rope_at``), no [max_len] tables

    def __init__(self, f: FastLlama, rows: int, max_len: int, window: int, sinks: int = 0):
        if window < 1:
            raise ValueError(f"kv_window must be >= 1, got {window}")
        self.window, self.sinks = window, sinks
        # What a prefill hands ``_after_prefill``: the prompts' K/V per layer (a one-pass prefill,
        # or sink_window's chunked store with the columns it kept), or int8's chunked store.
        self._prompt_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prompt_cols: torch.Tensor | None = None
        self._chunked_kv: list | None = None
        super().__init__(f, rows, max_len, cuda_graphs=False, share_prompts=False)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.f.rope_at(positions)

    def _store_prompt_kv(self, p: PrefillLayout, li: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if li == 0:
            self._prompt_kv = []
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

    def _chunk_store(self, p: PrefillLayout) -> Int8Prefill:
        return Int8Prefill(self, p)

    def _after_prefill(self, p: PrefillLayout) -> None:
        W, R, ex = p.W, self.R, p.expand
        a = max(W - R, 0)  # prompt columns stored as int8
        slots = torch.arange(a, W, device=ex.device) % R
        chunked = self._chunked_kv
        if chunked is not None:  # int8 columns already made by the chunks (``Int8Prefill``)
            for li, (q8s, tails) in enumerate(chunked):
                for q8, sc, ring, (pq, ps), tail in ((self.qk[li], self.sk[li], self.k[li], q8s[0], tails[0]),
                                                     (self.qv[li], self.sv[li], self.v[li], q8s[1], tails[1])):
                    if a and pq.data_ptr() != q8.data_ptr():  # (not written in place)
                        q8[:, :, :a], sc[:, :, :a] = pq.index_select(0, ex), ps.index_select(0, ex)
                    ring[:, :, slots] = tail.index_select(0, ex)
            self._chunked_kv = None
        for li, (k, v) in enumerate(self._prompt_kv):
            for x, q8, sc, ring in ((k, self.qk[li], self.sk[li], self.k[li]), (v, self.qv[li], self.sv[li], self.v[li])):
                x = x.index_select(0, ex)
                if a:
                    q8[:, :, :a], sc[:, :, :a] = quantize(x[:, :, :a])
                ring[:, :, slots] = x[:, :, a:]
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
        """Scores over the int8 columns and over the ring (in slot order, the mask permuted to
        match), one softmax over both. The scales are folded into the small tensors, scores and
        probabilities (``q . (s k) = s (q . k)``), so the int8 K/V are only converted, never
        rescaled or concatenated at full size: one pass over the cache a step."""
        n, S, R = self.n, self.col + 1, self.R
        a = S - R  # int8 columns
        if a <= 0:
            return self._attend_over(q, self.k[li][:n, :, :S], self.v[li][:n, :, :S], mask)
        f = self.f
        nkv, hd, dt = f.num_kv, f.head_dim, f.kv_dtype
        slot_cols = a + (torch.arange(R, device=q.device) - a % R) % R  # the column in each ring slot
        Kq = self.qk[li][:n, :, :a].to(dt).view(n * nkv, a, hd)
        Vq = self.qv[li][:n, :, :a].to(dt).view(n * nkv, a, hd)
        sk = self.sk[li][:n, :, :a].reshape(n * nkv, 1, a)
        sv = self.sv[li][:n, :, :a].reshape(n * nkv, 1, a)
        Kr = self.k[li][:n].reshape(n * nkv, R, hd)
        Vr = self.v[li][:n].reshape(n * nkv, R, hd)
        if f.device.type == "cpu":  # additive [n * kv, rep, S]
            bias = torch.cat([mask[..., :a], mask.index_select(-1, slot_cols)], -1)
        else:  # bool [n, 1, 1, S]
            keep = torch.cat([mask[..., :a], mask.index_select(-1, slot_cols)], -1)
            bias = torch.zeros(keep.shape, dtype=dt, device=q.device).masked_fill_(~keep, float("-inf"))
            bias = bias.expand(n, nkv, f.rep, S).reshape(n * nkv, f.rep, S)
        qh = q.reshape(n * nkv, f.rep, hd) * hd ** -0.5
        scores = torch.cat([torch.bmm(qh, Kq.transpose(1, 2)) * sk, torch.bmm(qh, Kr.transpose(1, 2))], -1) + bias
        p = scores.softmax(-1)
        out = torch.bmm(p[..., :a] * sv, Vq) + torch.bmm(p[..., a:], Vr)
        return out.view(n, f.num_heads * hd)

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
        return lambda cols: self._visible(p.positions[:, None, cols], qpos)[:, None]

    def _chunk_store(self, p: PrefillLayout) -> SinkPrefill:
        return SinkPrefill(self, p)

    def _after_prefill(self, p: PrefillLayout) -> None:
        ex = p.expand
        cols = self._prompt_cols  # the columns a chunked prefill kept (None: all W)
        self._prompt_cols = None
        if cols is None:
            cols = torch.arange(p.W, device=ex.device)
        m = len(cols)
        keep, kpos = p.mask[:, cols], p.positions[:, cols]
        if m > self.cap:  # keep what the first decode step (at position = length) can see
            nxt = p.positions[:, -1:] + 1
            keep = keep & self._visible(kpos, nxt)
            width = int(keep.sum(1).max())
            idx = torch.sort(keep.int(), dim=1, stable=True).indices[:, m - width:]  # kept ones last, in order
        else:
            width, idx = m, torch.arange(m, device=ex.device).expand(len(p.lengths), m)
        gidx = idx[:, None, :, None].expand(-1, self.f.num_kv, -1, self.f.head_dim)
        for li, (k, v) in enumerate(self._prompt_kv):
            self.k[li][:, :, :width] = k.gather(2, gidx).index_select(0, ex)
            self.v[li][:, :, :width] = v.gather(2, gidx).index_select(0, ex)
        self._prompt_kv = []
        self.valid[:, :width] = keep.gather(1, idx).index_select(0, ex)
        self.colpos[:, :width] = kpos.gather(1, idx).index_select(0, ex)
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


def _no_past(p: PrefillLayout, name: str) -> None:
    if p.C != p.W:
        raise ValueError(f"kv_cache={name!r} keeps no exact prefix: prefill(past=...) needs kv_cache='full'")


class SinkPrefill:
    """``kv_cache="sink_window"``'s chunked-prefill store (the protocol of ``kv_cache.WidePrefill``):
    per layer only the columns a later query can still see, the sinks (a column that is one of
    the first ``kv_sinks`` tokens of some prompt) and the last ``kv_window`` columns before the
    next chunk, plus the chunk being run; ``cols`` holds their columns. What a chunk reads is
    what the whole-width buffers would give it under the window (equal outputs, tested), and the
    store never holds more than ``sinks x prompts + window + chunk`` columns."""

    def __init__(self, state: SinkWindowState, p: PrefillLayout):
        _no_past(p, state.name)
        self.state, self.p = state, p
        self.sink_col = (p.mask & (p.positions < state.sinks)).any(0)  # [W]
        self.cols = torch.zeros(0, dtype=torch.long, device=p.mask.device)
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(state.f.layers)

    def write(self, li: int, s: int, e: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if li == 0:
            self.cols = torch.cat([self.cols, torch.arange(s, e, device=self.cols.device)])
        old = self.kv[li]
        self.kv[li] = (k, v) if old is None else (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))

    def keys(self, li: int, e: int) -> tuple[Loader, int, torch.Tensor]:
        k, v = self.kv[li]
        return dense(k, v), k.shape[2], self.cols

    def end(self, e: int) -> None:
        """Evict the columns no query at column >= e can see."""
        keep = self.sink_col[self.cols] | (self.cols > e - self.state.window)
        if bool(keep.all()):
            return
        idx = keep.nonzero().squeeze(1)
        self.cols = self.cols[idx]
        self.kv = [(k.index_select(2, idx), v.index_select(2, idx)) for k, v in self.kv]

    def finish(self) -> None:
        self.state._prompt_kv = [kv for kv in self.kv if kv is not None]
        self.state._prompt_cols = self.cols


class Int8Prefill:
    """``kv_cache="int8"``'s chunked-prefill store (the protocol of ``kv_cache.WidePrefill``): the
    columns older than the last ``kv_window`` before the next chunk are quantised as the prefill
    passes them (into the rows' int8 cache itself when one row per prompt), the rest kept in full
    precision (``tail``, columns ``t0 .. e-1``); a chunk reads the int8 columns dequantised block
    by block, as a decode step reads them, so the prompt is never held at full precision and
    whole width at once."""

    def __init__(self, state: Int8State, p: PrefillLayout):
        _no_past(p, state.name)
        self.state, self.p = state, p
        U, f = len(p.lengths), state.f
        self.a = max(p.W - state.R, 0)  # columns int8 at the end
        self.t0 = 0
        rows_in_order = U == state.rows and bool((p.expand == torch.arange(U, device=p.expand.device)).all())
        self.q8: list[tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = []
        for li in range(len(f.layers)):
            pair = []
            for q8, sc in ((state.qk[li], state.sk[li]), (state.qv[li], state.sv[li])):
                if rows_in_order:
                    pair.append((q8[:U, :, :self.a], sc[:U, :, :self.a]))
                else:
                    pair.append((torch.empty((U, f.num_kv, self.a, f.head_dim), dtype=torch.int8, device=f.device),
                                 torch.empty((U, f.num_kv, self.a), dtype=f.kv_dtype, device=f.device)))
            self.q8.append((pair[0], pair[1]))
        self.tail: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(f.layers)

    def write(self, li: int, s: int, e: int, k: torch.Tensor, v: torch.Tensor) -> None:
        old = self.tail[li]
        self.tail[li] = (k, v) if old is None else (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))

    def keys(self, li: int, e: int) -> tuple[Loader, int, None]:
        (qk, sk), (qv, sv) = self.q8[li]
        tk, tv = self.tail[li]
        t0, dt = self.t0, self.state.f.kv_dtype

        def load(i0: int, i1: int) -> tuple[torch.Tensor, torch.Tensor]:
            if i0 >= t0:
                return tk[:, :, i0 - t0:i1 - t0], tv[:, :, i0 - t0:i1 - t0]
            j = min(i1, t0)
            k, v = dequantize(qk[:, :, i0:j], sk[:, :, i0:j], dt), dequantize(qv[:, :, i0:j], sv[:, :, i0:j], dt)
            if i1 > t0:
                k, v = torch.cat([k, tk[:, :, :i1 - t0]], 2), torch.cat([v, tv[:, :, :i1 - t0]], 2)
            return k, v

        return load, e, None

    def end(self, e: int) -> None:
        """Quantise the columns that leave the full-precision window before the next chunk."""
        t1 = min(max(e - self.state.R, 0), self.a)
        if t1 <= self.t0:
            return
        n = t1 - self.t0
        for li, (kv, ((qk, sk), (qv, sv))) in enumerate(zip(self.tail, self.q8)):
            (tk, tv) = kv
            qk[:, :, self.t0:t1], sk[:, :, self.t0:t1] = quantize(tk[:, :, :n])
            qv[:, :, self.t0:t1], sv[:, :, self.t0:t1] = quantize(tv[:, :, :n])
            self.tail[li] = (tk[:, :, n:].clone(), tv[:, :, n:].clone())
        self.t0 = t1

    def finish(self) -> None:
        self.state._chunked_kv = list(zip(self.q8, self.tail))


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
