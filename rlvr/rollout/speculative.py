"""Speculative decoding: a small draft model proposes ``k`` tokens, the target checks them all in
one forward over ``k + 1`` positions, and keeps the longest prefix it agrees with.

- Greedy (``temperature == 0``): a draft token is kept while it equals the target's argmax at its
  position; the first disagreement is replaced by the target's own argmax, and when all ``k``
  agree the target's next argmax comes free. The output is the target's greedy decode, token for
  token (up to float rounding of a ``k + 1``-position forward against one-token steps: exact
  near-ties could differ; tested on tiny models with several seeds).
- Sampling (``temperature > 0``, with ``top_p``): the rule of Leviathan et al. 2023 / Chen et al.
  2023: draft token ``d ~ q`` is accepted with probability ``min(1, p(d) / q(d))``; the first
  rejected one is replaced by a draw from ``norm(max(0, p - q))``; after ``k`` acceptances a
  bonus token is drawn from ``p``. ``p`` and ``q`` are the target's and draft's sampling
  distributions (``softmax(top_p(logits / T))``), so the tokens follow the target's sampling
  distribution exactly (``accept_and_resample``; tested against an enumerated reference and by
  sampling).
- Log-probs are the target's plain policy (temperature 1, no top-p), as ``Completion.logprobs``
  of ``engine.generate``.
- Batched: all rows run each round together; rows accept different numbers of tokens. Both
  models' caches keep every fed column, and a round's rejected columns are masked out of the
  row's key-validity mask (its position counter steps back), so rows never need to realign; a
  fast-decoder cache that fills is compacted to its valid columns (``_FastSpec.defrag``).
  Finished rows leave the batch (``compact``).
- Backends: rlvr's fast decoder (``FastLlama`` states, multi-token forward ``_FastSpec.extend``)
  or the Hugging Face forward (any causal LM, e.g. an int8 ``quantize_dynamic`` model: its cache
  grows by the fed columns and the attention mask carries the holes).

- Prompt lookup (``draft="ngram"``, ``NgramDraft``): no draft model; each row proposes up to ``k``
  tokens copied from its own context after the latest earlier match of its last 1..3 tokens
  (``ngram_propose``), the point-mass draft verified by the same rules.

What it does not do: stop strings (stop token ids and ``max_new_tokens`` only), ``n > 1``
(repeat the prompt), tree drafts, or an adaptive ``k``. Docs: docs/serve.md, "Fast mode".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.rollout.decoder import FastLlama, unsupported_reason
from rlvr.rollout.engine import Completion, SamplingParams, model_stop_ids
from rlvr.rollout.gemm import lin
from rlvr.rollout.hf_backend import HFState
from rlvr.rollout.kv_cache import DecodeState, KVPrefix
from rlvr.rollout.sampling import top_p_filter


@dataclass
class SpecStats:
    """Counters of speculative calls: draft tokens proposed and accepted, verify rounds."""

    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


def ngram_propose(context: Sequence[int], k: int, max_ngram: int = 3) -> list[int]:
    """Prompt lookup: the ``k`` tokens (fewer where the context ends) that followed the most recent
    earlier occurrence of the context's last ``n`` tokens, ``n`` from ``max_ngram`` down to 1; []
    when none occurs."""
    L = len(context)
    if k <= 0:
        return []
    for n in range(min(max_ngram, L - 1), 0, -1):
        tail = list(context[L - n:])
        for i in range(L - n - 1, -1, -1):
            if context[i] == tail[0] and list(context[i:i + n]) == tail:
                return list(context[i + n:i + n + k])
    return []


@dataclass(frozen=True)
class NgramDraft:
    """A draft with no model: prompt-lookup (n-gram) proposals from each row's own context
    (``ngram_propose``); pass it (or the string ``"ngram"``) as ``speculative_generate``'s draft."""

    max_ngram: int = 3

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return ngram_propose(context, k, self.max_ngram)


def check_pair(target: torch.nn.Module, draft: torch.nn.Module, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Refuse a draft whose token ids do not mean the target's: another vocabulary size, other
    EOS ids, or (when both tokenizers are given) another vocabulary."""
    tv, dv = target.get_output_embeddings().weight.shape[0], draft.get_output_embeddings().weight.shape[0]
    if tv != dv:
        raise ValueError(f"draft and target vocabularies differ: {dv} vs {tv} logits (same tokenizer needed)")
    if model_stop_ids(target) != model_stop_ids(draft):
        raise ValueError(f"draft and target EOS ids differ: {model_stop_ids(draft)} vs {model_stop_ids(target)}")
    if target_tokenizer is not None and draft_tokenizer is not None and target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError("draft and target tokenizers differ (same vocabulary needed)")


# -- the acceptance rule -------------------------------------------------------------------------
def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution tokens are sampled from: ``softmax(top_p(logits / T))`` (float32 [..., V])."""
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1]) / temperature
    return top_p_filter(flat, top_p).softmax(-1).reshape(shape)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from probabilities [n, V] (inverse CDF, one uniform per row)."""
    cdf = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=generator.device if generator is not None else probs.device)
    u = u.to(probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))`` per row; ``p`` where that is all zero (p == q: never reached by a
    rejection, defined so the result is a distribution)."""
    r = (p - q).clamp_(min=0)
    s = r.sum(-1, keepdim=True)
    return torch.where(s > 0, r / s.clamp(min=1e-30), p)


def accept_and_resample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                        generator: torch.Generator | None,
                        lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection-sampling rule. ``p`` [n, k+1, V] target probabilities at each draft position
    and one past; ``q`` [n, k, V] draft probabilities; ``drafts`` [n, k] (drawn from ``q``).
    Returns (accepted [n]: how many leading drafts are kept, next [n]: the token after them, from
    ``residual(p, q)`` at the first rejection or from ``p`` after ``k`` acceptances). ``lens`` [n]:
    row r proposes only its first ``lens[r]`` drafts (its ``q`` past them must be zero)."""
    n, k = drafts.shape
    pd = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    qd = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand((n, k), generator=generator, device=generator.device if generator is not None else p.device).to(p.device)
    ok = u * qd < pd  # u < p/q, i.e. probability min(1, p/q)
    if lens is not None:
        ok &= torch.arange(k, device=ok.device) < lens[:, None]
    accepted = ok.long().cumprod(-1).sum(-1)
    idx = accepted[:, None, None].expand(n, 1, p.shape[-1])
    p_at = p.gather(1, idx).squeeze(1)
    q_pad = torch.cat([q, q.new_zeros((n, 1, p.shape[-1]))], 1)  # after k acceptances: residual(p, 0) = p
    dist = residual(p_at, q_pad.gather(1, idx).squeeze(1))
    return accepted, draw(dist, generator)


def greedy_accept(target_logits: torch.Tensor, drafts: torch.Tensor,
                  lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy: drafts kept while they equal the target's argmax; then the target's argmax.
    ``lens`` [n]: row r proposes only its first ``lens[r]`` drafts."""
    best = target_logits.argmax(-1)  # [n, k+1]
    k = drafts.shape[1]
    ok = best[:, :k] == drafts
    if lens is not None:
        ok &= torch.arange(k, device=ok.device) < lens[:, None]
    accepted = ok.long().cumprod(-1).sum(-1)
    return accepted, best.gather(1, accepted[:, None]).squeeze(1)


# -- model states that take several tokens per row and roll back ----------------------------------
class _FastSpec:
    """A fast-decoder ``DecodeState`` (per-row cache, no shared prompts) with ``extend`` (a
    multi-token forward per row) and ``truncate`` (mask a round's rejected columns)."""

    def __init__(self, model: torch.nn.Module, rows: int, max_len: int):
        self.f = FastLlama(model)
        self.st: DecodeState = self.f.start(rows, max_len, share_prompts=False)
        self.device = self.f.device

    def prefill(self, prompts, pad_token_id: int, past=None) -> torch.Tensor:
        expand = torch.arange(len(prompts), device=self.device)
        return self.st.prefill(list(prompts), expand, pad_token_id, past=past)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` [n, m] after each row's valid tokens; logits [n, m, V] float32."""
        st, f = self.st, self.f
        n, m = tokens.shape
        self.reserve(m)
        if m == 1:  # the decoder's own one-token step (its masks read ``valid``: holes included)
            return st.step(tokens[:, 0])[:, None]
        c0, S = st.col, st.col + m
        valid = st.valid[:n]
        valid[:, c0:S] = True
        pos = st.pos[:n, None] + torch.arange(m, device=self.device)
        cos, sin = st.cos[pos], st.sin[pos]  # [n, m, hd]
        cols = torch.arange(S, device=self.device)
        causal = cols[None, :] <= (c0 + torch.arange(m, device=self.device))[:, None]  # [m, S]
        am = (valid[:, None, :S] & causal[None])[:, None]  # [n, 1, m, S]
        nh, nkv, hd = f.num_heads, f.num_kv, f.head_dim
        x = F.embedding(tokens, f.embed)
        for li, L in enumerate(f.layers):
            qkv = lin(f.rms(x, L.ln1), L.wqkv, L.bqkv)
            qk = f.rope(f.qk_norm(qkv[..., : (nh + nkv) * hd].unflatten(-1, (nh + nkv, hd)), L), cos, sin).to(f.kv_dtype)
            st.k[li][:n, :, c0:S] = qk[..., nh:, :].transpose(1, 2)
            st.v[li][:n, :, c0:S] = qkv[..., (nh + nkv) * hd:].unflatten(-1, (nkv, hd)).transpose(1, 2)
            K, V = st.k[li][:n, :, :S], st.v[li][:n, :, :S]
            if f.rep > 1:
                K, V = K.repeat_interleave(f.rep, dim=1), V.repeat_interleave(f.rep, dim=1)
            a = F.scaled_dot_product_attention(qk[..., :nh, :].transpose(1, 2), K, V, attn_mask=am)
            x = x + lin(a.transpose(1, 2).flatten(2), L.wo, L.bo, keep=True)
            x = x + f.mlp(x, L)
        st.pos[:n] += m
        st.col = S
        return f.logits(x)

    def reserve(self, m: int) -> None:
        """Room for ``m`` more columns (compacting the cache when it is full); call before
        noting a round's start column, which compaction moves."""
        if self.st.col + m > self.st.max_len:
            self.defrag()

    def truncate(self, start: int, keep: torch.Tensor) -> None:
        """Keep row r's first ``keep[r]`` columns fed since column ``start``; mask the rest."""
        st = self.st
        n = st.n
        v = st.valid[:n, start:st.col]
        drop = v & (v.long().cumsum(1) > keep[:, None])
        v &= ~drop
        st.pos[:n] -= drop.sum(1)

    def defrag(self) -> None:
        """Move each row's valid columns to the right end of a block starting at column 0 (RoPE is
        already in the keys, so their order and positions are what matter)."""
        st = self.st
        n, c = st.n, st.col
        valid = st.valid[:n, :c]
        counts = valid.sum(1)
        W = int(counts.max())
        order = torch.argsort(valid.long(), dim=1, stable=True)[:, c - W:]  # valid columns last, in order
        for buf in (*st.k, *st.v):
            idx = order[:, None, :, None].expand(n, buf.shape[1], W, buf.shape[3])
            buf[:n, :, :W] = buf[:n, :, :c].gather(2, idx)
        kept = valid.gather(1, order)  # (before clearing: ``valid`` is a view)
        st.valid[:n] = False
        st.valid[:n, :W] = kept
        st.col = W

    def compact(self, keep: torch.Tensor) -> None:
        self.st.compact(keep)

    def prefix(self, row: int, start: int) -> KVPrefix:
        return self.st.prefix(row, start)

    @property
    def col(self) -> int:
        return self.st.col


class _HFSpec:
    """The Hugging Face forward behind the same interface: the attention mask carries the holes."""

    def __init__(self, model: torch.nn.Module):
        self.h = HFState(model)
        self.model, self.device = model, self.h.device

    def prefill(self, prompts, pad_token_id: int, past=None) -> torch.Tensor:
        return self.h.prefill(list(prompts), torch.arange(len(prompts), device=self.device), pad_token_id)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.h
        n, m = tokens.shape
        h.mask = torch.cat([h.mask, h.mask.new_ones((n, m))], 1)
        pos = h.next_pos[:, None] + torch.arange(m, device=self.device)
        logits = self.model(input_ids=tokens, attention_mask=h.mask, position_ids=pos, use_cache=True,
                            **{h.cache_kwarg: h.cache}).logits.float()
        h.next_pos = h.next_pos + m
        return logits

    def reserve(self, m: int) -> None:
        pass  # the Hugging Face cache grows

    def truncate(self, start: int, keep: torch.Tensor) -> None:
        h = self.h
        v = h.mask[:, start:]
        drop = (v > 0) & (v.cumsum(1) > keep[:, None])
        v.masked_fill_(drop, 0)
        h.next_pos = h.next_pos - drop.sum(1)

    def compact(self, keep: torch.Tensor) -> None:
        self.h.compact(keep)

    def prefix(self, row: int, start: int):
        return None  # the Hugging Face cache is not kept

    @property
    def col(self) -> int:
        return self.h.mask.shape[1]


def _spec_state(model, backend: str, rows: int, max_len: int):
    reason = unsupported_reason(model, max_len) if backend != "hf" else "hf asked for"
    if reason is not None and backend == "fast":
        raise ValueError(f"the fast decoder cannot run this model: {reason}")
    return _FastSpec(model, rows, max_len) if reason is None else _HFSpec(model)


# -- the decode loop ---------------------------------------------------------------------------------
def speculative_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | NgramDraft | str | None,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    k: int = 4,
    generator: torch.Generator | None = None,
    pad_token_id: int,
    backend: str = "auto",
    draft_backend: str = "auto",
    past: Sequence[KVPrefix | None] | None = None,
    keep_cache: bool = False,
    draft_past: Sequence[KVPrefix | None] | None = None,
    draft_caches: list | None = None,
    max_tokens: Sequence[int] | None = None,
    on_tokens: Callable[[int, list[int], list[float], str | None], bool] | None = None,
    stats: SpecStats | None = None,
) -> list[Completion]:
    """One completion per prompt (``params.n`` must be 1), sampled from ``target`` with ``draft``
    proposing ``k`` tokens per round (module docstring); ``draft=None`` (or ``k=0``) decodes the
    target alone, one token per forward. ``draft="ngram"`` (or an ``NgramDraft``): prompt-lookup
    proposals, no draft model (a row with no match proposes nothing that round).

    ``past`` / ``draft_past`` (fast decoder only): per prompt the model's K/V of its first tokens,
    as in ``engine.generate``; ``keep_cache`` returns with each completion the target's K/V of its
    prompt (``Completion.cache``, prompt columns only: what a prefix cache keeps), and a list
    passed as ``draft_caches`` is filled with the draft's. ``max_tokens[i]`` caps prompt i below
    ``params.max_new_tokens``. ``on_tokens(i, tokens, logprobs, finish_reason)`` is called as
    prompt i's tokens are accepted (streaming); returning True drops the row (a cancelled
    request). ``stats`` accumulates proposed/accepted counts."""
    if params.n != 1:
        raise ValueError("speculative_generate samples one completion per prompt (repeat a prompt for more)")
    if params.stop:
        raise ValueError("speculative decoding stops on stop token ids and max_new_tokens, not stop strings")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if draft == "ngram":
        draft = NgramDraft()
    if draft is None or k == 0:
        draft, k = None, 0
    elif not isinstance(draft, NgramDraft):
        check_pair(target, draft)
    dmodel = draft if isinstance(draft, torch.nn.Module) else None
    T = params.max_new_tokens
    if max_tokens is not None and (len(max_tokens) != len(prompts) or not all(1 <= m <= T for m in max_tokens)):
        raise ValueError(f"max_tokens needs one value in 1..max_new_tokens ({T}) per prompt")
    if not prompts or T == 0:
        return [Completion(i, [], [], "length") for i in range(len(prompts))]
    stats = stats if stats is not None else SpecStats()
    stop_ids = params.stop_token_ids if params.stop_token_ids is not None else model_stop_ids(target)
    was = (target.training, (dmodel or target).training)
    target.eval(), (dmodel or target).eval()
    try:
        with torch.inference_mode():
            spec = _Spec(target, draft, prompts, params, k, generator, pad_token_id, backend, draft_backend,
                         stop_ids, stats)
            spec.budget = list(max_tokens) if max_tokens is not None else [T] * len(prompts)
            spec.on_tokens = on_tokens
            return spec.run(past, keep_cache, draft_past, draft_caches)
    finally:
        (dmodel or target).train(was[1]), target.train(was[0])


class _Spec:
    """One speculative call's states and bookkeeping (``speculative_generate``)."""

    def __init__(self, target, draft, prompts, params: SamplingParams, k, generator, pad, backend,
                 draft_backend, stop_ids, stats: SpecStats):
        n, W, T = len(prompts), max(len(p) for p in prompts), params.max_new_tokens
        max_len = W + 2 * T + 2 * (k + 1)
        self.tgt = _spec_state(target, backend, n, max_len)
        self.ngram = draft if isinstance(draft, NgramDraft) else None
        self.dft = _spec_state(draft, draft_backend, n, max_len) if draft is not None and self.ngram is None else None
        self.prompts, self.params, self.k, self.gen, self.pad = prompts, params, k, generator, pad
        self.stop = set(stop_ids)
        self.stats = stats
        self.out_tokens: list[list[int]] = [[] for _ in range(n)]
        self.out_lps: list[list[float]] = [[] for _ in range(n)]
        self.stopped = [False] * n
        self.caches: list[KVPrefix | None] = [None] * n
        self.budget: list[int] = [T] * n
        self.on_tokens = None

    def pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token per row from logits [n, V], and its sampling distribution (None when greedy)."""
        if self.params.temperature == 0:
            return logits.argmax(-1), None
        q = sampling_probs(logits, self.params.temperature, self.params.top_p)
        return draw(q, self.gen), q

    def run(self, past, keep_cache: bool, draft_past=None, draft_caches: list | None = None) -> list[Completion]:
        W = max(len(p) for p in self.prompts)
        fast_t, fast_d = isinstance(self.tgt, _FastSpec), isinstance(self.dft, _FastSpec)
        dft = self.dft
        logits = self.tgt.prefill(self.prompts, self.pad, past=past if fast_t else None)
        if keep_cache and fast_t:
            self.caches = [self.tgt.prefix(r, W - len(p)) for r, p in enumerate(self.prompts)]
        if dft is not None:
            dft.prefill(self.prompts, self.pad, past=draft_past if fast_d else None)
        if draft_caches is not None:
            draft_caches[:] = [self.dft.prefix(r, W - len(p)) if fast_d else None for r, p in enumerate(self.prompts)]
        first, _ = self.pick(logits)
        lp0 = logits.log_softmax(-1).gather(-1, first[:, None]).squeeze(-1)
        present = list(range(len(self.prompts)))
        alive = self._record(present, first[:, None], lp0[:, None], torch.ones_like(first))
        pend = first
        while True:
            present, pend = self._drop_finished(present, alive, pend)
            if not present:
                break
            # k shrinks near the end of the longest budget left (rows with less room just cut)
            room = max(self.budget[r] - len(self.out_tokens[r]) for r in present)
            accepted, nxt, toks, lps = self._round(pend, min(self.k, room - 1), present)
            alive = self._record(present, toks, lps, accepted + 1)
            pend = nxt
        return [Completion(r, self.out_tokens[r], self.out_lps[r], "stop" if self.stopped[r] else "length",
                           cache=self.caches[r]) for r in range(len(self.prompts))]

    def _round(self, pend: torch.Tensor, k: int, present: list[int]):
        """Draft k tokens, verify them with one target forward, roll both caches back to the kept
        ones. Returns (accepted [n], next token [n], emitted tokens [n, k+1], their logprobs)."""
        if self.ngram is not None:
            return self._ngram_round(pend, k, present)
        n = pend.shape[0]
        drafts, qs = [], []
        self.tgt.reserve(k + 1)
        tstart = self.tgt.col
        if k:
            self.dft.reserve(k + 1)
            dstart = self.dft.col
        tok = pend
        for _ in range(k):
            d, q = self.pick(self.dft.extend(tok[:, None])[:, 0])
            drafts.append(d)
            qs.append(q)
            tok = d
        if k:
            self.dft.extend(tok[:, None])  # the last draft's K/V, kept when all k are accepted
        d = torch.stack(drafts, 1) if k else pend.new_zeros((n, 0))
        tl = self.tgt.extend(torch.cat([pend[:, None], d], 1))  # [n, k+1, V]
        if self.params.temperature == 0:
            accepted, nxt = greedy_accept(tl, d)
        else:
            p = sampling_probs(tl, self.params.temperature, self.params.top_p)
            q = torch.stack(qs, 1) if k else p[:, :0]
            accepted, nxt = accept_and_resample(p, q, d, self.gen)
        self.tgt.truncate(tstart, accepted + 1)
        if k:
            self.dft.truncate(dstart, accepted + 1)
        toks = torch.cat([d, torch.zeros_like(pend[:, None])], 1).scatter_(1, accepted[:, None], nxt[:, None])
        lps = tl.log_softmax(-1).gather(-1, toks[..., None]).squeeze(-1)
        self.stats.rounds += 1
        self.stats.proposed += k * n
        self.stats.accepted += int(accepted.sum())
        return accepted, nxt, toks, lps

    def _ngram_round(self, pend: torch.Tensor, k: int, present: list[int]):
        """``_round`` with prompt-lookup proposals: row r's context is its prompt and tokens so far
        (ending with ``pend``); rows propose 0..k tokens, padded to the longest, the padding never
        accepted. No draft model to run or roll back."""
        n = pend.shape[0]
        props = [self.ngram.propose(list(self.prompts[r]) + self.out_tokens[r], k) for r in present]
        m = max(map(len, props), default=0)
        lens = torch.tensor([len(p) for p in props], device=pend.device)
        d = torch.tensor([p + [0] * (m - len(p)) for p in props], dtype=pend.dtype, device=pend.device).reshape(n, m)
        self.tgt.reserve(m + 1)
        tstart = self.tgt.col
        tl = self.tgt.extend(torch.cat([pend[:, None], d], 1))  # [n, m+1, V]
        if self.params.temperature == 0:
            accepted, nxt = greedy_accept(tl, d, lens)
        else:  # the draft's distribution is a point mass on its token (zero past the row's proposal)
            p = sampling_probs(tl, self.params.temperature, self.params.top_p)
            q = F.one_hot(d, p.shape[-1]).to(p.dtype) * (torch.arange(m, device=d.device) < lens[:, None])[..., None]
            accepted, nxt = accept_and_resample(p, q, d, self.gen, lens)
        self.tgt.truncate(tstart, accepted + 1)
        toks = torch.cat([d, torch.zeros_like(pend[:, None])], 1).scatter_(1, accepted[:, None], nxt[:, None])
        lps = tl.log_softmax(-1).gather(-1, toks[..., None]).squeeze(-1)
        self.stats.rounds += 1
        self.stats.proposed += int(lens.sum())
        self.stats.accepted += int(accepted.sum())
        return accepted, nxt, toks, lps

    def _record(self, present: list[int], toks: torch.Tensor, lps: torch.Tensor, counts: torch.Tensor) -> list[bool]:
        """Append each present row's first ``counts`` tokens, cut at a stop token or the budget
        (``on_tokens`` told); returns which rows are still alive."""
        alive = []
        for r, row, lp, c in zip(present, toks.tolist(), lps.tolist(), counts.tolist()):
            out, start = self.out_tokens[r], len(self.out_tokens[r])
            reason = None
            for t, l in zip(row[:c], lp[:c]):
                out.append(t)
                self.out_lps[r].append(l)
                if t in self.stop:
                    self.stopped[r], reason = True, "stop"
                    break
                if len(out) >= self.budget[r]:
                    reason = "length"
                    break
            self.stats.tokens += len(out) - start
            drop = self.on_tokens is not None and self.on_tokens(r, out[start:], self.out_lps[r][start:], reason)
            alive.append(reason is None and not drop)
        return alive

    def _drop_finished(self, present: list[int], alive: list[bool], pend: torch.Tensor):
        if all(alive):
            return present, pend
        keep_l = [i for i, a in enumerate(alive) if a]
        if keep_l:
            keep = torch.tensor(keep_l, device=pend.device)
            self.tgt.compact(keep)
            if self.dft is not None:
                self.dft.compact(keep)
            pend = pend.index_select(0, keep)
        return [present[i] for i in keep_l], pend
