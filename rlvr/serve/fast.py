"""The fast mode of ``rlvr serve`` (``--fast``): a ``ServingEngine`` with a prefix cache across
requests, speculative decoding with a small draft model (``--draft DIR``, ``--spec-tokens K``)
or with prompt-lookup proposals and no draft model (``--draft ngram``), and, optionally, an int8 target (``--quantize int8``).

Scheduling: batches ("waves"). The engine thread takes up to ``max_batch`` waiting requests that
sample alike (same temperature, top-p and stop ids, in arrival order) and decodes them together
with ``rollout/speculative.py`` until all have finished; requests that arrive meanwhile wait for
the next wave. Each round of a wave drafts ``K`` tokens per row and verifies them in one target
forward, so a row advances by 1 to ``K + 1`` tokens per round and streams them as they are
accepted. Rows leave the wave as they finish (stop token, stop string, ``max_tokens``, cancel), but
no row joins a running wave: that is what continuous batching (``rlvr/serve/batcher.py``, the
normal mode) does and this engine does not.

Per request, before its wave: its prompt's longest cached block-aligned prefix (``PrefixCache``,
16-token blocks, LRU bounded in bytes) is taken from the cache for the target and for the draft, so
a shared system prompt is prefilled once; after the prefill, the prompt's K/V are stored.

Exactness: greedy requests get the target's greedy tokens (speculative decoding changes the speed,
not the output; up to float rounding at exact near-ties). Sampled requests follow the target's
distribution (the rejection-sampling rule), but a wave shares one random stream: a request's
``seed`` seeds the wave's stream when it is the wave's first, and tokens then depend on the batch
(the normal mode gives each request its own stream). Log-probs are the target's plain policy.

int8 (``quantize="int8"``): the target's decoder Linear layers in dynamic int8
(``rlvr/model/quantize.py``), run by rlvr's fast decoder (with the prefix cache). Its accuracy
cost and speed: docs/fast_mode.md.

Weight updates (``load_weights``) apply between waves, to the target only (the draft keeps its
weights: acceptance may drop, greedy output still follows the new target; an int8 target is
quantised again from the updated full-precision weights); the prefix caches are cleared.

Without a draft, ``rlvr serve --fast`` does not use this engine: it runs continuous batching with
the prefix cache (``rlvr/serve/batcher.py``), which keeps every row busy where waves wait for
their slowest row.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future

import torch

from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.decoder import unsupported_reason
from rlvr.rollout.engine import SamplingParams, model_stop_ids
from rlvr.rollout.prefix_cache import PrefixCache
from rlvr.rollout.speculative import (
    NgramDraft,
    SpecStats,
    check_pair,
    speculative_generate,
)
from rlvr.serve.intake import Intake
from rlvr.serve.sampling import request_generator
from rlvr.serve.types import GenRequest, NotReady, RequestHandle, TokenEvent

QUANTIZE = (None, "int8")
log = logging.getLogger(__name__)


class FastEngine(Intake):
    """Prefix cache + speculative decoding (+ int8) behind the ``ServingEngine`` protocol
    (module docstring). ``draft``: a model with the target's tokenizer, ``"ngram"`` / an
    ``NgramDraft`` (prompt lookup, no model), or None (no speculation);
    ``spec_tokens``: draft tokens per round (``K``)."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, draft: torch.nn.Module | NgramDraft | str | None = None,
                 spec_tokens: int = 4, quantize: str | None = None, prefix_cache_bytes: int = 256 << 20,
                 prefix_block: int = 16, max_batch: int = 16, max_waiting: int = 64,
                 max_context: int | None = None, seed: int = 0):
        if quantize not in QUANTIZE:
            raise ValueError(f"--quantize must be int8 (or absent), got {quantize!r}")
        if spec_tokens < 0 or max_batch < 1 or max_waiting < 0:
            raise ValueError(f"--spec-tokens must be >= 0, --max-batch >= 1, --max-waiting >= 0 "
                             f"(got {spec_tokens}, {max_batch}, {max_waiting})")
        if draft == "ngram":
            draft = NgramDraft()
        if isinstance(draft, torch.nn.Module):
            check_pair(model, draft)
            draft = draft.eval()
        elif draft is not None and not isinstance(draft, NgramDraft):
            raise ValueError(f"draft must be a model, 'ngram' or None, got {draft!r}")
        self.model = model.eval()  # full precision: weight updates land here
        self.draft, self.k, self.quantize, self.tokenizer = draft, spec_tokens, quantize, tokenizer
        self.target = self._serving_copy()
        self._open_intake(model, max_waiting, max_context)
        self.max_batch, self.seed = max_batch, seed
        self.stop_ids = model_stop_ids(model)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        fast_target = unsupported_reason(self.target, self.max_context) is None
        self.cache = PrefixCache(prefix_cache_bytes, prefix_block) if fast_target else None
        fast_draft = isinstance(draft, torch.nn.Module) and unsupported_reason(draft, self.max_context) is None
        self.draft_cache = PrefixCache(prefix_cache_bytes, prefix_block) if fast_draft else None
        self.spec = SpecStats()
        self.counters = {"steps": 0, "admitted": 0, "generated_tokens": 0, "waves": 0}
        self._running: list[RequestHandle] = []
        self._thread = threading.Thread(target=self._loop, name="rlvr-serve-fast", daemon=True)
        self._thread.start()

    # -- the ServingEngine interface (any thread) -------------------------------------------------
    def cancel(self, handle: RequestHandle) -> None:
        handle.cancelled = True  # a waiting one ends when taken, a running one at its next round

    def stats(self) -> dict[str, int | float]:
        caches = {}
        if self.cache is not None:
            caches = self.cache.stats()
        with self._lock:
            return {"running": len(self._running), "waiting": len(self._waiting), "version": self._version,
                    "prefix_cache_hits": 0, **caches, **self.counters,
                    "spec_proposed": self.spec.proposed, "spec_accepted": self.spec.accepted,
                    "spec_acceptance_rate": round(self.spec.acceptance_rate, 4)}

    def load_weights(self, model_dir: str) -> int:
        return self._queue_update(self.model, model_dir)

    # -- the engine thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._closed or self._waiting or self._updates):
                    self._lock.wait()
                if self._closed:
                    break
                updates = list(self._updates)
                self._updates.clear()
                wave = self._take_wave()
                self._running = wave
            for params, done in updates:
                self._swap(params, done)
            if wave:
                try:
                    self._run_wave(wave)
                except Exception:  # the requests end, the server stays up
                    log.exception("fast engine: a wave failed; its requests end with 'abort'")
                    for h in wave:
                        h.put(TokenEvent(None, None, "abort", self._version))
                finally:
                    with self._lock:
                        self._running = []
        self._abort_all()

    def _key(self, req: GenRequest) -> tuple:
        stop = req.stop_token_ids if req.stop_token_ids is not None else self.stop_ids
        return (float(req.temperature), float(req.top_p) if req.temperature > 0 else 1.0, tuple(stop))

    def _take_wave(self) -> list[RequestHandle]:
        """Up to ``max_batch`` waiting requests that sample alike (under the lock)."""
        wave, rest, key = [], deque(), None
        while self._waiting:
            h = self._waiting.popleft()
            if h.cancelled:
                h.put(TokenEvent(None, None, "abort", self._version))
            elif len(wave) < self.max_batch and (key is None or self._key(h.request) == key):
                key = self._key(h.request)
                wave.append(h)
            else:
                rest.append(h)
        self._waiting = rest
        return wave

    def _swap(self, params: dict, done: Future) -> None:
        try:
            self.target = self._copy_in(params)
            for c in (self.cache, self.draft_cache):
                if c is not None:
                    c.clear()
            self._version += 1
            done.set_result(self._version)
        except Exception as e:  # noqa: BLE001 - handed to the caller
            done.set_exception(e)

    def _run_wave(self, wave: list[RequestHandle]) -> None:
        version = self._version
        live = []
        for h in wave:
            self._arrivals += 1
            self.counters["admitted"] += 1
            req = h.request
            if req.prompt_logprobs:
                ids = torch.tensor([req.prompt_ids])
                with torch.inference_mode():
                    h.prompt_logprobs = sequence_logprobs(self.target, ids, torch.ones_like(ids))[0].tolist()
            if req.max_tokens == 0:
                h.put(TokenEvent(None, None, "length", version))
            else:
                live.append(h)
        if not live:
            return
        self.counters["waves"] += 1
        first = live[0].request
        key = ("seed", first.seed) if first.seed is not None else ("engine", self.seed, self._arrivals)
        temperature, top_p, stop = self._key(first)
        prompts = [list(h.request.prompt_ids) for h in live]
        budgets = [h.request.max_tokens for h in live]
        params = SamplingParams(max_new_tokens=max(budgets), temperature=temperature, top_p=top_p,
                                stop_token_ids=stop)
        history: list[list[int]] = [[] for _ in live]

        def on_tokens(i: int, toks: list[int], lps: list[float], reason: str | None) -> bool:
            h, req = live[i], live[i].request
            if h.cancelled or self._closed:
                h.put(TokenEvent(None, None, "abort", version))
                return True
            for j, (t, lp) in enumerate(zip(toks, lps)):
                history[i].append(t)
                end = reason if j == len(toks) - 1 else None
                if end is None and req.stop and self._stop_string(history[i], req.stop):
                    end = "stop"
                h.put(TokenEvent(t, lp, end, version))
                self.counters["generated_tokens"] += 1
                if end is not None:
                    return True
            return False

        draft_caches: list = []
        before = self.spec.rounds
        out = speculative_generate(
            self.target, self.draft, prompts, params, k=self.k, generator=request_generator(*key),
            pad_token_id=self.pad,
            past=[self.cache.lookup(p) for p in prompts] if self.cache is not None else None,
            keep_cache=self.cache is not None,
            draft_past=[self.draft_cache.lookup(p) for p in prompts] if self.draft_cache is not None else None,
            draft_caches=draft_caches, max_tokens=budgets, on_tokens=on_tokens, stats=self.spec)
        self.counters["steps"] += self.spec.rounds - before + 1  # rounds + the prefill
        for p, c, d in zip(prompts, out, draft_caches or [None] * len(out)):
            if self.cache is not None and c.cache is not None:
                self.cache.insert(p, c.cache)
            if self.draft_cache is not None and d is not None:
                self.draft_cache.insert(p, d)

    def _stop_string(self, history: list[int], stops: tuple[str, ...]) -> bool:
        window = 4 * max(len(s) for s in stops) + 4
        text = self.tokenizer.decode(history[-window:])
        return any(s in text for s in stops)

    def _abort_all(self) -> None:
        with self._lock:
            pending = list(self._waiting)
            self._waiting.clear()
        for h in pending:
            h.put(TokenEvent(None, None, "abort", self._version))
        for _, done in self._updates:
            done.set_exception(NotReady("the server is shutting down"))


def from_serve_config(cfg, model: torch.nn.Module, tokenizer) -> FastEngine:
    """The ``SERVING_ENGINES`` factory of ``rlvr serve --fast`` (``rlvr/serve/config.py``): ``cfg.draft``
    (a directory, "ngram" for prompt lookup, "" for none), ``cfg.quantize`` ("" or "int8"), ``cfg.spec_tokens`` and the
    normal mode's bounds. The draft loads on the target's device and dtype."""
    from transformers import AutoTokenizer

    from rlvr.model.load import load_model

    p = next(model.parameters())
    draft = None
    if cfg.draft == "ngram":
        draft = "ngram"
    elif cfg.draft:
        draft = load_model(cfg.draft, dtype=p.dtype, device=p.device)
        check_pair(model, draft, tokenizer, AutoTokenizer.from_pretrained(cfg.draft))
    return FastEngine(model, tokenizer, draft=draft, spec_tokens=cfg.spec_tokens, quantize=cfg.quantize or None,
                      max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, max_context=cfg.max_context or None,
                      seed=cfg.seed)
