"""rlvr.rollout.prefix_cache: same greedy tokens with and without the cache, hits counted, a
shared system prompt prefilled once (tokens run through the prefill counted), LRU bounded in bytes."""

from __future__ import annotations

import pytest
import torch
from fast_models import PAD, TARGET, arith_tokenizer, noisy_model

from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.kv_cache import DecodeState, KVPrefix
from rlvr.rollout.prefix_cache import PrefixCache, cached_generate, prefix_bytes
from rlvr.rollout.speculative import speculative_generate

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=())


@pytest.fixture(scope="module")
def tok():
    return arith_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return noisy_model(TARGET, tok, 0)


@pytest.fixture(scope="module")
def system(tok):
    ids = tok("You are a careful calculator. Compute each sum and answer with the number. " * 2)["input_ids"]
    assert len(ids) >= 40
    return ids


def questions(tok, system):
    return [system + tok(f"Compute: {a} + {b}")["input_ids"] for a, b in ((3, 4), (12, 9), (7, 7))]


@pytest.fixture
def prefilled(monkeypatch):
    """Counts the prompt tokens each prefill runs through the model (columns x prompts)."""
    counts: list[int] = []
    layout = DecodeState._layout

    def spy(self, prompts, expand, pad, past, *rest):
        p = layout(self, prompts, expand, pad, past, *rest)
        counts.append(p.C * len(prompts))
        return p

    monkeypatch.setattr(DecodeState, "_layout", spy)
    return counts


def test_same_tokens_with_and_without_the_cache_and_a_shorter_prefill(tok, model, system, prefilled):
    qs = questions(tok, system)
    cache = PrefixCache(block=16)
    for i, q in enumerate(qs):
        plain = generate(model, [q], GREEDY, pad_token_id=PAD)
        n_plain = prefilled[-1]
        got = cached_generate(model, [q], GREEDY, cache, pad_token_id=PAD)
        assert got[0].token_ids == plain[0].token_ids
        assert torch.allclose(torch.tensor(got[0].logprobs), torch.tensor(plain[0].logprobs), atol=1e-4)
        if i == 0:
            assert (cache.hits, cache.misses) == (0, 1) and prefilled[-1] == n_plain == len(q)
        else:  # the system prompt's whole blocks come from the cache
            assert cache.hits == i
            assert prefilled[-1] == len(q) - len(system) // 16 * 16 < n_plain
    assert cache.tokens_reused == 2 * (len(system) // 16 * 16)


def test_a_batch_mixing_hits_and_misses(tok, model, system):
    qs = questions(tok, system) + [tok("Compute: 1 + 1")["input_ids"]]
    cache = PrefixCache(block=8)
    cached_generate(model, qs[:1], GREEDY, cache, pad_token_id=PAD)
    plain = generate(model, qs, GREEDY, pad_token_id=PAD)
    got = cached_generate(model, qs, GREEDY, cache, pad_token_id=PAD)
    assert [c.token_ids for c in got] == [c.token_ids for c in plain]
    assert cache.hits == 3 and cache.misses == 2  # first call: 1 miss; second: 3 hits, 1 miss


def test_speculative_generate_takes_the_cached_prefix(tok, model, system, prefilled):
    qs = questions(tok, system)
    cache = PrefixCache(block=16)
    ref = generate(model, qs, GREEDY, pad_token_id=PAD)
    for q, r in zip(qs, ref):
        out = speculative_generate(model, model, [q], GREEDY, k=3, pad_token_id=PAD, past=[cache.lookup(q)],
                                   keep_cache=True)
        cache.insert(q, out[0].cache)
        assert out[0].token_ids == r.token_ids
    assert cache.hits == 2


def test_lookup_finds_a_shorter_boundary_of_a_longer_entry():
    cache = PrefixCache(block=4)
    kv = KVPrefix([torch.arange(40.0).reshape(1, 10, 4)], [torch.zeros(1, 10, 4)])
    cache.insert(list(range(11)), kv)  # stored under its first 8 tokens
    assert cache.lookup(list(range(11))).length == 8
    hit = cache.lookup([0, 1, 2, 3, 4, 99])  # shares one block
    assert hit.length == 4 and torch.equal(hit.k[0], kv.k[0][:, :4])
    assert cache.lookup([9, 9, 9, 9, 9]) is None
    assert cache.lookup([0, 1, 2, 3]) is None  # the last prompt token always runs: no block to use
    assert (cache.hits, cache.misses) == (2, 2)


def test_lru_bounded_in_bytes():
    one = KVPrefix([torch.zeros(1, 4, 4)], [torch.zeros(1, 4, 4)])
    cache = PrefixCache(max_bytes=2 * prefix_bytes(one), block=4)
    for first in (1, 2, 3):
        cache.insert([first, 0, 0, 0, 5], one)
    assert len(cache) == 2 and cache.bytes == 2 * prefix_bytes(one)
    assert cache.lookup([1, 0, 0, 0, 7]) is None  # the oldest left
    assert cache.lookup([2, 0, 0, 0, 7]) is not None
    cache.insert([4, 0, 0, 0, 5], one)  # 3 is now the least recently used
    assert cache.lookup([3, 0, 0, 0, 7]) is None and cache.lookup([2, 0, 0, 0, 7]) is not None
