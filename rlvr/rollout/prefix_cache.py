"""A prefix cache across requests: the K/V of prompt prefixes seen before, so a request whose
prompt starts with one (a shared system prompt, a few-shot header) prefills only the rest.

- Keys are token-id prefixes cut at multiples of ``block`` tokens (16 by default): a prompt of
  ``L`` tokens is stored under its longest block-aligned prefix shorter than ``L`` (the last
  prompt token always runs: its logits start the decode), and found under any block boundary of
  it, so a later prompt sharing only the first blocks (the system prompt) still hits. Lookup walks
  a new prompt's boundaries from the longest down; an entry found under a shorter boundary gives
  a slice (a view) of its K/V.
- Values are the engine's ``KVPrefix`` (``rollout/kv_cache.py``): what ``generate(past=...)``,
  ``DecodeState.prefill(past=...)`` and ``speculative_generate(past=...)`` start from.
- Bounded in bytes (``max_bytes``): least recently used entries leave first. Counters: ``hits``,
  ``misses``, ``tokens_reused`` (prompt tokens taken from the cache), ``bytes``.

``cached_generate`` is the engine's ``generate`` with the cache in front: look up every prompt,
generate with ``past``, store the prompts' K/V (``keep_cache``). Greedy outputs are the same
token ids as without the cache (tested; the cached K/V are the values a fresh prefill computes,
up to float rounding of a shorter forward).

Not thread-safe: one engine thread owns it. Entries hold K/V of one model's weights: call
``clear()`` after a weight update.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from rlvr.rollout.kv_cache import KVPrefix


def prefix_bytes(p: KVPrefix) -> int:
    return sum(t.numel() * t.element_size() for t in (*p.k, *p.v))


class PrefixCache:
    """LRU of prompt-prefix K/V keyed by block-aligned token prefixes (module docstring)."""

    def __init__(self, max_bytes: int = 256 << 20, block: int = 16):
        if block < 1 or max_bytes < 0:
            raise ValueError(f"block must be >= 1 and max_bytes >= 0 (got {block}, {max_bytes})")
        self.max_bytes, self.block = max_bytes, block
        self._entries: OrderedDict[tuple[int, ...], KVPrefix] = OrderedDict()
        self._index: dict[tuple[int, ...], tuple[int, ...]] = {}  # boundary prefix -> entry key
        self.hits = self.misses = self.tokens_reused = self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _boundaries(self, prompt: Sequence[int]) -> range:
        """Block-aligned lengths strictly shorter than the prompt, longest first."""
        top = (len(prompt) - 1) // self.block * self.block
        return range(top, 0, -self.block)

    def lookup(self, prompt: Sequence[int]) -> KVPrefix | None:
        """The K/V of the longest cached block-aligned prefix of ``prompt`` (None: a miss)."""
        prompt = tuple(prompt)
        for n in self._boundaries(prompt):
            key = self._index.get(prompt[:n])
            if key is not None:
                entry = self._entries[key]
                self._entries.move_to_end(key)
                self.hits += 1
                self.tokens_reused += n
                return entry if entry.length == n else KVPrefix([k[:, :n] for k in entry.k], [v[:, :n] for v in entry.v])
        self.misses += 1
        return None

    def insert(self, prompt: Sequence[int], kv: KVPrefix) -> None:
        """Keep ``kv`` (the K/V of ``prompt``'s first tokens, at least its longest block-aligned
        prefix) under that prefix; a prefix already covered by a longer entry adds nothing."""
        prompt = tuple(prompt)
        bounds = [n for n in self._boundaries(prompt) if n <= kv.length]
        if not bounds:
            return
        n = bounds[0]
        key = prompt[:n]
        have = self._index.get(key)
        if have is not None:
            self._entries.move_to_end(have)
            return
        entry = KVPrefix([k[:, :n].clone() for k in kv.k], [v[:, :n].clone() for v in kv.v])
        size = prefix_bytes(entry)
        if size > self.max_bytes:
            return
        self._entries[key] = entry
        self.bytes += size
        for m in range(self.block, n + 1, self.block):
            self._index[key[:m]] = key  # (a newer, longer entry takes over shorter boundaries)
        while self.bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        key, entry = self._entries.popitem(last=False)
        self.bytes -= prefix_bytes(entry)
        for m in range(self.block, len(key) + 1, self.block):
            if self._index.get(key[:m]) == key:
                del self._index[key[:m]]
                # a shorter boundary may still be covered by another entry that shares it
                other = next((k for k in reversed(self._entries) if len(k) >= m and k[:m] == key[:m]), None)
                if other is not None:
                    self._index[key[:m]] = other

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.bytes = 0

    def stats(self) -> dict[str, int]:
        return {"prefix_cache_hits": self.hits, "prefix_cache_misses": self.misses,
                "prefix_cache_tokens_reused": self.tokens_reused, "prefix_cache_bytes": self.bytes,
                "prefix_cache_entries": len(self._entries)}


def cached_generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], params, cache: PrefixCache,
                    **kwargs):
    """``engine.generate`` with ``cache`` in front (fast decoder): each prompt starts from its
    longest cached prefix, and every prompt's K/V is stored afterwards. ``kwargs`` go to
    ``generate`` (``past`` and ``keep_cache`` are set here; the returned completions keep no
    cache)."""
    from rlvr.rollout.engine import generate

    past = [cache.lookup(p) for p in prompts]
    out = generate(model, prompts, params, past=past, keep_cache=True, **kwargs)
    for c in out:
        if c.cache is not None:
            cache.insert(prompts[c.prompt_index], c.cache)
            c.cache = None
    return out
