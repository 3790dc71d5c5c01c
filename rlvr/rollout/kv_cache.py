"""The fast decoder's KV cache and the passes that fill it: prefill, decode steps, compaction.

- ``DecodeState`` (from ``FastLlama.start``): a preallocated KV cache (one tensor per layer for K
  and one for V, ``[rows, kv_heads, max_len, head_dim]``), the key-validity mask of the
  left-padded prompts and each row's next position. ``prefill`` runs each distinct prompt once
  and gives its K/V to all of its sample rows; ``step`` runs one token per row; ``compact`` keeps
  only some rows (finished rows leave the batch); ``prefix(row, start)`` copies a row's K/V out
  as a ``KVPrefix``.
- Prefix reuse across calls: ``prefill(..., past=...)`` takes, per prompt, the ``KVPrefix`` of
  its first tokens (what the previous turn of a multi-turn episode computed) and runs only the
  rest; the prompts are still left-padded to a common width, the forward covers the last ``C``
  columns (``C`` = the longest uncached suffix), attending to the copied columns before them.
- Chunked prefill (``prefill(..., chunk=N)``, ``SamplingParams.prefill_chunk``): the running
  columns go through the layers N at a time; each chunk writes its K/V into a per-prompt buffer of
  the whole width (``WidePrefill``: the rows' cache itself when one row per prompt; the bounded
  caches' stores keep only what later chunks can read) and attends to the columns
  before it plus itself (causal) N key columns at a time (``rollout/block_attention.py``: the
  softmax merged across key blocks), so the activations (``[U, N, hidden]``) and attention scores
  (``[U, heads, N, N]``) are bounded by the chunk, not by the prompt. Greedy tokens and log-probs
  equal the one-pass prefill (to float rounding). The last layer of an earlier chunk only stores
  its K/V.
- Memory-bounded caches (``rollout/kv_compress.py``): subclasses that store the K/V differently
  (int8 beyond a recent window; StreamingLLM sinks + window) override the hooks ``_allocate``,
  ``_store_prompt_kv``, ``_after_prefill``, ``_next_mask``, ``_write_kv``, ``_attend`` and
  ``compact``; ``kv_bytes()`` gives the cache's bytes for any of them.
- Attention: grouped-query without repeating K/V in a decode step (the query heads of one KV head
  side by side); ``F.scaled_dot_product_attention`` in prefill and on GPU, one ``baddbmm`` and one
  ``bmm`` for a CPU decode step; on CPU, prompts with several sample rows are read once per prompt
  (``SharedPrompts``). With ``cuda_graphs`` the step is the capturable ``step_static``
  (``StepGraphs``). Design and measurements: docs/rollout.md, "Design of the fast decoder".

No autograd: it runs under ``torch.inference_mode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rlvr.rollout.block_attention import Loader, block_attention, dense
from rlvr.rollout.cuda_graphs import StepGraphs, bucket
from rlvr.rollout.gemm import lin, lin_res
from rlvr.rollout.shared_prompts import SharedPrompts

if TYPE_CHECKING:
    from rlvr.rollout.decoder import FastLlama, Layer


@dataclass
class KVPrefix:
    """The keys and values of a sequence's first ``length`` tokens, per layer
    ``[kv_heads, length, head_dim]``: what ``prefill(past=...)`` starts from instead of running
    those tokens again."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[1]


@dataclass
class PrefillLayout:
    """One prefill's distinct prompts, left-padded to width ``W``; the forward runs the last
    ``C`` columns (the rest comes from ``past``)."""

    lengths: list[int]
    cached: list[int]  # tokens of each prompt taken from ``past``
    past: list[KVPrefix | None] | None
    W: int
    C: int
    ids: torch.Tensor  # [U, W]
    mask: torch.Tensor  # [U, W] bool: real tokens
    positions: torch.Tensor  # [U, W]
    attn_mask: torch.Tensor | None  # [U, 1, C, W] (None when chunked: built per chunk)
    cos: torch.Tensor | None  # [U, C, hd] (None when chunked: per chunk)
    sin: torch.Tensor | None
    expand: torch.Tensor  # prompt of each row
    direct: bool  # one row per prompt, in order: the rows' cache is written in place
    shared: SharedPrompts | None
    chunk: int = 0  # > 0: columns run this many at a time (``attn_mask`` is then None)


class WidePrefill:
    """A chunked prefill's K/V store for the plain cache: per layer a buffer of the whole width
    ``[U, kv_heads, W, head_dim]`` (the rows' cache itself when one row per prompt), given to the
    cache by ``finish``. The bounded caches have their own (``rollout/kv_compress.py``), holding
    only what later chunks and decode steps can read. The protocol: ``write(li, s, e, k, v)`` a
    chunk's K/V of layer ``li``; ``keys(li, e) -> (load, n_keys, key_cols)`` what a query before
    column ``e`` may attend to (``block_attention``'s loader; ``key_cols`` None: key i is column
    i); ``end(e)`` after all layers of the chunk ending at ``e``; ``finish()`` after the last."""

    def __init__(self, state: DecodeState, p: PrefillLayout):
        self.state, self.p = state, p
        self.bufs = [state._prompt_buffers(p, li) for li in range(len(state.f.layers))]

    def write(self, li: int, s: int, e: int, k: torch.Tensor, v: torch.Tensor) -> None:
        K, V = self.bufs[li]
        K[:, :, s:e], V[:, :, s:e] = k, v

    def keys(self, li: int, e: int) -> tuple[Loader, int, torch.Tensor | None]:
        K, V = self.bufs[li]
        return dense(K, V), e, None

    def end(self, e: int) -> None:
        pass

    def finish(self) -> None:
        for li, (K, V) in enumerate(self.bufs):
            self.state._store_prompt_kv(self.p, li, K, V)


class DecodeState:
    """KV cache and per-row state for one batch of rows (see the module docstring).
    ``share_prompts=False``: every row attends to its own copy of its prompt (the path the GPU
    takes; tests compare the two on CPU)."""

    def __init__(self, f: FastLlama, rows: int, max_len: int, cuda_graphs: bool, share_prompts: bool = True):
        self.f, self.rows, self.max_len = f, rows, max_len
        self._allocate(cuda_graphs)
        self.pos = torch.zeros(rows, dtype=torch.long, device=f.device)
        self.cos, self.sin = f.rope_tables(max_len) if self.rope_tables else (None, None)
        self.n = rows  # rows in use (a prefix of the buffers)
        self.col = 0  # cache column the next step writes
        self.share_prompts = share_prompts and not cuda_graphs and f.device.type == "cpu"
        self.shared: SharedPrompts | None = None  # set by prefill when prompts have several rows
        self.graphs = StepGraphs(self) if cuda_graphs else None

    rope_tables = True  # cos/sin tables of every position up to max_len (False: ``_rope`` computes them)
    in_place = True  # prefill may write one-row-per-prompt K/V straight into ``self.k`` / ``self.v``

    def _allocate(self, cuda_graphs: bool) -> None:
        """The cache buffers: K and V per layer ``[rows, kv_heads, max_len, head_dim]`` and the
        key-validity mask."""
        f = self.f
        shape = (self.rows, f.num_kv, self.max_len, f.head_dim)
        # Eager steps read only written columns; a captured step reads all of them (masked), and
        # 0 x NaN from uninitialised memory would still be NaN, so those caches start at zero.
        alloc = torch.zeros if cuda_graphs else torch.empty
        self.k = [alloc(shape, dtype=f.kv_dtype, device=f.device) for _ in f.layers]
        self.v = [alloc(shape, dtype=f.kv_dtype, device=f.device) for _ in f.layers]
        self.valid = torch.zeros((self.rows, self.max_len), dtype=torch.bool, device=f.device)

    def kv_bytes(self) -> int:
        """Bytes held by the KV cache: every layer's K/V buffers (and the shared prompts' K/V)."""
        bufs = [*self.k, *self.v]
        if self.shared is not None:
            bufs += [*self.shared.k, *self.shared.v]
        return sum(t.numel() * t.element_size() for t in bufs)

    # -- prefill ---------------------------------------------------------------------------------
    def prefill(self, prompts: list, expand: torch.Tensor, pad_token_id: int,
                past: list[KVPrefix | None] | None = None, chunk: int = 0) -> torch.Tensor:
        """Run the distinct ``prompts`` once (left-padded) and copy each one's K/V to its rows
        (``expand[r]`` = prompt of row r). ``past[k]``, when given, holds the K/V of prompt k's
        first tokens: only the columns after the shortest-covered suffix run (see the module
        docstring). ``chunk`` > 0: the running columns ``chunk`` at a time (chunked prefill).
        Returns the last-position logits per row [rows, V]."""
        f = self.f
        p = self._layout(prompts, expand, pad_token_id, past, chunk)
        if p.chunk:
            x = self._chunked(p)
        else:
            x = F.embedding(p.ids[:, p.W - p.C:], f.embed)
            for li, L in enumerate(f.layers):
                x = self._prefill_layer(p, x, li, L)
        self._after_prefill(p)
        return f.logits(x[:, -1]).index_select(0, expand)

    def _after_prefill(self, p: PrefillLayout) -> None:
        """The rows' mask, positions and next column once the prompts' K/V are stored."""
        expand = p.expand
        self.valid[:, :p.W] = p.mask.index_select(0, expand)
        self.pos.copy_(p.positions[:, -1].index_select(0, expand) + 1)
        self.col = p.W
        self.shared = p.shared
        if p.shared is not None:
            p.shared.set_rows(expand.tolist())

    def _chunked(self, p: PrefillLayout) -> torch.Tensor:
        """Chunked prefill: the running columns ``p.chunk`` at a time through all layers, each
        chunk's K/V handed to the cache's prefill store (``_chunk_store``: whole-width buffers
        here) and its queries attending to the keys the store holds up to its end. Returns the
        last chunk's hidden states (the last layer's: of its last position only)."""
        f = self.f
        W, C = p.W, p.C
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        store = self._chunk_store(p)
        last = len(f.layers) - 1
        x = None
        for s in range(W - C, W, p.chunk):
            e = min(s + p.chunk, W)
            final = e == W
            cos, sin = self._rope(p.positions[:, s:e])
            x = F.embedding(p.ids[:, s:e], f.embed)
            for li, L in enumerate(f.layers):
                qkv = lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)  # [U, e - s, (nh + 2 nkv) hd]
                qk = f.rope(f.qk_norm(qkv[..., : (nh + nkv) * hd].unflatten(-1, (nh + nkv, hd)), L), cos, sin).to(f.kv_dtype)
                store.write(li, s, e, qk[..., nh:, :].transpose(1, 2),
                            qkv[..., (nh + nkv) * hd:].unflatten(-1, (nkv, hd)).transpose(1, 2).to(f.kv_dtype))
                if li == last and not final:
                    break  # only this chunk's K/V matter here; its last layer's output is never read
                q, q_start = qk[..., :nh, :].transpose(1, 2), s
                if li == last:
                    q, x, q_start = q[:, :, -1:], x[:, -1:], e - 1
                load, n_keys, cols = store.keys(li, e)
                valid = p.mask[:, :e] if cols is None else p.mask.index_select(1, cols)
                a = block_attention(q, load, n_keys, q_start, valid, p.chunk, self._chunk_visible(p, q_start, e), cols)
                x = x + lin(a.transpose(1, 2).flatten(2), L.wo, L.bo, keep=True)
                x = x + f.mlp(x, L)
            store.end(e)
        store.finish()
        return x

    def _chunk_store(self, p: PrefillLayout) -> WidePrefill:
        """Where a chunked prefill keeps the prompts' K/V: whole-width buffers (``WidePrefill``)."""
        return WidePrefill(self, p)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at ``positions`` (any shape) -> [..., head_dim], from the state's tables."""
        return self.cos[positions], self.sin[positions]

    def _chunk_visible(self, p: PrefillLayout, s: int, e: int):
        """A further restriction of query columns ``s .. e-1`` to the keys at given columns, for
        ``block_attention`` (None here: causal over real tokens only)."""
        return None

    def _prompt_buffers(self, p: PrefillLayout, li: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole-width K/V buffers [U, nkv, W, hd] of layer ``li`` for a chunked prefill: the rows'
        cache itself when ``p.direct``; left padding zeroed, ``past`` columns copied in."""
        U, W, C = len(p.lengths), p.W, p.C
        nkv, hd, dt, dev = self.f.num_kv, self.f.head_dim, self.f.kv_dtype, self.f.device
        K = self.k[li][:U, :, :W] if p.direct else torch.empty((U, nkv, W, hd), dtype=dt, device=dev)
        V = self.v[li][:U, :, :W] if p.direct else torch.empty((U, nkv, W, hd), dtype=dt, device=dev)
        for j, m in enumerate(p.cached):
            s0 = W - p.lengths[j]
            K[j, :, :min(s0, W - C)] = 0
            V[j, :, :min(s0, W - C)] = 0
            if m:
                K[j, :, s0:s0 + m] = p.past[j].k[li][:, :m]
                V[j, :, s0:s0 + m] = p.past[j].v[li][:, :m]
        return K, V

    def _prefill_mask(self, p: PrefillLayout, s: int, e: int) -> torch.Tensor:
        """The attention mask of query columns ``s .. e-1`` over key columns ``< e``: causal and
        over real tokens; a pad query sees itself. [U, 1, e - s, e] bool."""
        dev = p.mask.device
        kc = torch.arange(e, device=dev)
        qc = torch.arange(s, e, device=dev)
        causal = kc[None, :] <= qc[:, None]
        eye = kc[None, :] == qc[:, None]
        return ((causal & p.mask[:, None, :e]) | eye)[:, None]

    def _layout(self, prompts: list, expand: torch.Tensor, pad_token_id: int,
                past: list[KVPrefix | None] | None, chunk: int = 0) -> PrefillLayout:
        """The prompts left-padded into ids, mask and positions (counted over real tokens), the
        columns to run, and the causal + padding mask over them (pad queries see themselves)."""
        dev = self.f.device
        lengths = [len(p) for p in prompts]
        U, W = len(prompts), max(lengths)
        cached = [min(c.length, n - 1) if c is not None else 0 for c, n in zip(past or [None] * U, lengths)]
        C = max(n - m for n, m in zip(lengths, cached))  # columns W - C .. W - 1 run
        ids = torch.full((U, W), pad_token_id, dtype=torch.long)
        mask = torch.zeros((U, W), dtype=torch.bool)
        for k, p in enumerate(prompts):
            ids[k, W - lengths[k]:] = torch.as_tensor(list(p), dtype=torch.long)
            mask[k, W - lengths[k]:] = True
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        direct = self.in_place and U == self.rows and bool((expand == torch.arange(U, device=dev)).all())
        shared = None
        if U < self.rows and self.share_prompts:
            shared = SharedPrompts(U, W, mask, self.f.num_kv, self.f.kv_dtype)
        chunk = chunk if 0 < chunk < C else 0
        p = PrefillLayout(lengths, cached, past, W, C, ids, mask, positions, None, None, None, expand, direct, shared, chunk)
        if not chunk:  # (chunked: rotary tables and masks are made per chunk)
            p.cos, p.sin = self._rope(positions[:, W - C:])  # [U, C, hd]
            p.attn_mask = self._prefill_mask(p, W - C, W)  # [U, 1, C, W]
        return p

    def _prefill_layer(self, p: PrefillLayout, x: torch.Tensor, li: int, L: Layer) -> torch.Tensor:
        """One layer over the prompts' running columns: their K/V stored (in the rows' cache or
        once per prompt), attention over the whole width. The last layer keeps only the last
        position (past the last K/V nothing else matters)."""
        f = self.f
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        qkv = lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)  # [U, C, (nh + 2 nkv) hd]
        qk = f.rope(f.qk_norm(qkv[..., : (nh + nkv) * hd].unflatten(-1, (nh + nkv, hd)), L), p.cos, p.sin).to(f.kv_dtype)
        q = qk[..., :nh, :].transpose(1, 2)
        k = qk[..., nh:, :].transpose(1, 2)  # [U, nkv, C, hd]
        v = qkv[..., (nh + nkv) * hd:].unflatten(-1, (nkv, hd)).transpose(1, 2).to(f.kv_dtype)
        if p.C < p.W:
            k, v = self._with_past(p, li, k, v)
        self._store_prompt_kv(p, li, k, v)
        if f.rep > 1:
            k = k.repeat_interleave(f.rep, dim=1)
            v = v.repeat_interleave(f.rep, dim=1)
        am = p.attn_mask
        if li == len(f.layers) - 1:
            q, am, x = q[:, :, -1:], p.attn_mask[:, :, -1:], x[:, -1:]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=am)
        x = x + lin(a.transpose(1, 2).flatten(2), L.wo, L.bo, keep=True)
        return x + f.mlp(x, L)

    def _with_past(self, p: PrefillLayout, li: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V over the whole width: the copied prefixes, then the columns just computed (written
        in place into the rows' cache when ``p.direct``). Left padding is zeroed: masked, but
        never garbage (0 x NaN)."""
        K, V = self._prompt_buffers(p, li)
        K[:, :, p.W - p.C:], V[:, :, p.W - p.C:] = k, v
        return K, V

    def _store_prompt_kv(self, p: PrefillLayout, li: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The prompts' K/V [U, nkv, W, hd] into the cache: once per prompt when shared (the
        rows' cache columns < W stay unwritten), else copied to every row of the prompt."""
        U, W = len(p.lengths), p.W
        nkv, hd = self.f.num_kv, self.f.head_dim
        if p.shared is not None:
            p.shared.k.append(k.reshape(U * nkv, W, hd))  # (a copy when k is a strided view)
            p.shared.v.append(v.reshape(U * nkv, W, hd))
        elif not (p.direct and (p.C < W or p.chunk)):  # (direct with a prefix or chunked: written in place)
            self.k[li][:, :, :W] = k.index_select(0, p.expand)
            self.v[li][:, :, :W] = v.index_select(0, p.expand)

    def prefix(self, row: int, start: int) -> KVPrefix:
        """A copy of row ``row``'s K/V from column ``start`` (where its prompt begins) to the
        last column written: its prompt and every token fed since."""
        sh = self.shared
        if sh is None:
            return KVPrefix([K[row, :, start:self.col].clone() for K in self.k],
                            [V[row, :, start:self.col].clone() for V in self.v])
        ks, vs = [], []  # the prompt's columns from the shared copy, then the row's own
        for li, (K, V) in enumerate(zip(self.k, self.v)):
            pk, pv = sh.prompt_kv(li, row, start)
            ks.append(torch.cat([pk, K[row, :, sh.width:self.col]], 1))
            vs.append(torch.cat([pv, V[row, :, sh.width:self.col]], 1))
        return KVPrefix(ks, vs)

    # -- decode ----------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row in use ([n] long); returns the next logits [n, V] float32."""
        if self.col >= self.max_len:
            raise RuntimeError("KV cache full")
        if self.graphs is not None:
            out = self.graphs.step(tokens)
            if out is not None:
                self.col += 1
                return out
        f, n = self.f, self.n
        mask = self._next_mask()
        pos = self.pos[:n]
        cos, sin = self._rope(pos)  # [n, hd]
        x = F.embedding(tokens, f.embed)
        for li, L in enumerate(f.layers):
            x = self._step_layer(x, li, L, cos, sin, mask)
        pos += 1
        self.col += 1
        return f.logits(x)

    def _next_mask(self) -> torch.Tensor | None:
        """Mark column ``col`` valid for the rows in use; the step's mask (``_step_mask``)."""
        valid = self.valid[:self.n]
        valid[:, self.col] = True
        return self._step_mask(valid, self.col + 1)

    def _step_mask(self, valid: torch.Tensor, S: int) -> torch.Tensor | None:
        """The padding mask of a decode step over columns < ``S``, for all layers: on CPU an
        additive one, [n * kv, rep, S]; elsewhere a bool one for SDPA; None with shared prompts
        (the prompts' mask is per prompt there; generated columns are all valid)."""
        if self.shared is not None:
            return None
        return self._bias(valid[:, :S])

    def _bias(self, keep: torch.Tensor) -> torch.Tensor:
        """A decode step's mask from ``keep`` [n, S] (the keys each row attends to): additive
        [n * kv, rep, S] on CPU, bool [n, 1, 1, S] for SDPA elsewhere."""
        f = self.f
        n, S = keep.shape
        if f.device.type == "cpu":
            bias = torch.zeros((n, S), dtype=f.kv_dtype).masked_fill_(~keep, float("-inf"))
            return bias[:, None].expand(n, f.num_heads, S).reshape(n * f.num_kv, f.rep, S)
        return keep[:, None, None, :]

    def _step_layer(self, x: torch.Tensor, li: int, L: Layer, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor:
        """One layer of a decode step: the new K/V written at column ``col``, attention, MLP."""
        f, n = self.f, self.n
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        qkv = lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)
        qk = f.rope(f.qk_norm(qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd), L), cos, sin).to(f.kv_dtype)
        self._write_kv(li, qk[:, nh:], qkv[:, (nh + nkv) * hd:].view(n, nkv, hd))
        a = self._attend(li, qk[:, :nh], mask)
        x = lin_res(x, a, L.wo, L.bo)
        return lin_res(x, f.act(x, L), L.wd, L.bd)

    def _write_kv(self, li: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """A decode step's new K/V [n, nkv, hd] of layer ``li`` into column ``col``."""
        self.k[li][:self.n, :, self.col] = k
        self.v[li][:self.n, :, self.col] = v

    def _attend(self, li: int, q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One query per row [n, nh, hd] against the cache columns written so far -> [n, nh * hd].
        The ``rep`` query heads of one KV head attend together as a rep-long query (no repeated
        K/V); on CPU scores + mask in one ``baddbmm``, then one ``bmm``."""
        n, S = self.n, self.col + 1
        K, V = self.k[li], self.v[li]
        if self.shared is not None:
            W = self.shared.width
            return self.shared.attend(li, q, K[:n, :, W:S], V[:n, :, W:S])
        return self._attend_over(q, K[:n, :, :S], V[:n, :, :S], mask)

    def _attend_over(self, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [n, nh, hd] against keys/values K, V [n, nkv, S, hd] under ``mask`` -> [n, nh * hd]."""
        f = self.f
        n, nkv, S, hd = K.shape
        nh, rep = f.num_heads, f.rep
        if f.device.type == "cpu":
            s = torch.baddbmm(mask, q.reshape(n * nkv, rep, hd),
                              K.reshape(n * nkv, S, hd).transpose(1, 2), alpha=hd ** -0.5)
            return torch.bmm(s.softmax(-1), V.reshape(n * nkv, S, hd)).view(n, nh * hd)
        return F.scaled_dot_product_attention(q.view(n, nkv, rep, hd), K, V, attn_mask=mask).reshape(n, nh * hd)

    def step_static(self, tokens: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        """The capturable step for CUDA graphs: all buffer rows, whole-cache attention under the
        mask, K/V written at the column held by ``col`` (a 1-element long tensor)."""
        if self.shared is not None:
            raise RuntimeError("step_static reads every row's prompt columns: not with shared prompts")
        f = self.f
        n = tokens.shape[0]
        valid = self.valid[:n]
        valid.index_fill_(1, col, True)
        pos = self.pos[:n]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = valid[:, None, None, :]
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        x = F.embedding(tokens, f.embed)
        for li, L in enumerate(f.layers):
            qkv = lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)
            qk = f.rope(f.qk_norm(qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd), L), cos, sin).to(f.kv_dtype)
            K, V = self.k[li][:n], self.v[li][:n]
            K.index_copy_(2, col, qk[:, nh:, None, :])
            V.index_copy_(2, col, qkv[:, (nh + nkv) * hd:].view(n, nkv, 1, hd).to(f.kv_dtype))
            a = F.scaled_dot_product_attention(qk[:, :nh].view(n, nkv, f.rep, hd), K, V, attn_mask=mask)
            x = x + lin(a.reshape(n, nh * hd), L.wo, L.bo, keep=True)
            x = x + f.mlp(x, L)
        pos += 1
        return f.logits(x)

    # -- compaction ------------------------------------------------------------------------------
    def compact(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (ascending indices into the rows in use), moved to the front.
        Rows already in place (before the first dropped row) are not copied, and only the cache
        columns written so far are."""
        keep_l = keep.tolist()
        first = next((i for i, r in enumerate(keep_l) if r != i), len(keep_l))
        m, c = len(keep_l), self.col
        lo = 0 if self.shared is None else self.shared.width  # (shared prompts: no prompt columns)
        if first < m:
            tail = keep[first:]
            for buf in (*self.k, *self.v):
                buf[first:m, :, lo:c] = buf[:, :, lo:c].index_select(0, tail)
            self.valid[first:m, :c] = self.valid[:, :c].index_select(0, tail)
            self.pos[first:m] = self.pos.index_select(0, tail)
        self.n = m
        if self.shared is not None:
            self.shared.set_rows([self.shared.rows[r] for r in keep_l])

    def worth_compacting(self, alive: int, remaining: int) -> bool:
        """Compaction policy. With CUDA graphs: when the live rows fit a smaller bucket. Otherwise
        when the finished rows' share of the ``remaining`` steps costs more than moving the live
        rows (on CPU, copying one row's cache costs about one row-step: docs/rollout.md,
        "Compaction policy"): finished x remaining >= alive."""
        if self.graphs is not None and self.graphs.enabled:
            return bucket(alive, self.rows) < bucket(self.n, self.rows)
        return (self.n - alive) * remaining >= alive
